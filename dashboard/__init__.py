"""The audit dashboard: a Streamlit app over the audit store, reading only through the named queries.

`callgate dashboard` serves `dashboard/app.py`; `dashboard.data` holds what each page reads
(Streamlit-free, timed by `bench/dashboard_queries.py`), `dashboard.ui` the reading cache and the
safe rendering helpers, `dashboard/views/` the pages. See docs/dashboard.md.
"""
