"""The dashboard's pages: scripts Streamlit runs through `st.navigation` (see `dashboard/app.py`).

Not named `pages/`: Streamlit would also serve a folder of that name next to the app as pages of
their own, without the app's sidebar.
"""
