"""The callgate audit dashboard: `streamlit run dashboard/app.py` (or `callgate dashboard`).

Reads `CALLGATE_API` or `CALLGATE_DB` (see `dashboard.config`). The sidebar's window, tenant and
Live switch apply to every page; each page is a script in `dashboard/views/`.
"""

from __future__ import annotations

import streamlit as st

from dashboard import ui
from dashboard.data import DEFAULT_WINDOW, WINDOWS

st.set_page_config(page_title="callgate audit", layout="wide")

PAGES = [
    st.Page("views/overview.py", title="Overview", url_path="overview", default=True),
    st.Page("views/blocked.py", title="Blocked attempts", url_path="blocked"),
    st.Page("views/call.py", title="Call detail", url_path="call"),
    st.Page("views/trends.py", title="Trends", url_path="trends"),
    st.Page("views/impact.py", title="Policy impact", url_path="impact"),
    st.Page("views/coverage.py", title="Coverage", url_path="coverage"),
    st.Page("views/pipeline.py", title="Pipeline health", url_path="pipeline"),
]

navigation = st.navigation(PAGES)
cfg = ui.config()
with st.sidebar:
    st.subheader("callgate audit")
    st.caption("Reading from")
    st.text(cfg.source)
    st.selectbox("Window", list(WINDOWS), index=list(WINDOWS).index(DEFAULT_WINDOW), key="window")
    st.text_input(
        "Tenant", key="tenant", placeholder="all tenants", help="Overview, Trends and Policy impact only this tenant."
    )
    st.toggle("Live", value=True, key="live", help=f"Refresh the live parts every {cfg.refresh_s:g} s.")
navigation.run()
