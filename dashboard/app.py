"""The callgate audit dashboard: `streamlit run dashboard/app.py` (or `callgate dashboard`).

Reads `CALLGATE_API` or `CALLGATE_DB` (see `dashboard.config`). The sidebar's window, tenant and
Live switch apply to every page and live in the URL (`?window=1h&tenant=acme&live=0`), as each
page's own filters do: the address bar is a link to what the page shows. Each page is a script in
`dashboard/views/`.
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
    st.Page("views/run.py", title="Run", url_path="run"),
    st.Page("views/trends.py", title="Trends", url_path="trends"),
    st.Page("views/impact.py", title="Policy impact", url_path="impact"),
    st.Page("views/coverage.py", title="Coverage", url_path="coverage"),
    st.Page("views/pipeline.py", title="Pipeline health", url_path="pipeline"),
]

navigation = st.navigation(PAGES)
cfg = ui.config()
ui.from_url("window", parse=ui.window_label)
ui.from_url("tenant")
ui.from_url("live", parse=lambda text: text not in ("0", "false", "off"))
with st.sidebar:
    st.subheader("callgate audit")
    st.caption("Reading from")
    st.text(cfg.source)
    if "window" not in st.session_state:
        st.session_state["window"] = DEFAULT_WINDOW
    st.selectbox("Window", list(WINDOWS), key="window")
    st.text_input(
        "Tenant", key="tenant", placeholder="all tenants", help="Overview, Trends and Policy impact only this tenant."
    )
    if "live" not in st.session_state:
        st.session_state["live"] = True
    st.toggle("Live", key="live", help=f"Refresh the live parts every {cfg.refresh_s:g} s.")
ui.to_url("window", ui.window_code(st.session_state["window"]), ui.window_code(DEFAULT_WINDOW))
ui.to_url("tenant", st.session_state.get("tenant"))
ui.to_url("live", "0" if not st.session_state["live"] else None)
navigation.run()
