"""The callgate audit dashboard: `streamlit run dashboard/app.py` (or `callgate dashboard`).

Reads `CALLGATE_API` or `CALLGATE_DB` (see `dashboard.config`). The sidebar's window, tenant, Live
switch and As of apply to every page and live in the URL (`?window=1h&tenant=acme&live=0&as_of=...`),
as each page's own filters do: the address bar is a link to what the page shows. As of (a lake, or
the read API over one) turns every page into a past view of the store, under a banner saying so. With a login configured
(`--auth`, `--login`), a browser session logs in first and sees what its roles allow: a session
limited to one tenant sees that tenant only, and not the pages that read every tenant. Each page is
a script in `dashboard/views/`.
"""

from __future__ import annotations

from urllib.parse import urlparse

import streamlit as st

from dashboard import ui
from dashboard.data import DEFAULT_WINDOW, WINDOWS
from dashboard.login import GLOBAL_PAGES
from dashboard.pages import PAGES as CONSOLE_PAGES

st.set_page_config(page_title="callgate audit", layout="wide")

PAGES = [
    st.Page(page.script, title=page.title, url_path=page.path, default=index == 0)
    for index, page in enumerate(CONSOLE_PAGES)
]
cfg = ui.config()
session = ui.login()
if session is None:
    # Not logged in: the pages stay registered (hidden), so the URL a link opened is still the
    # one shown once the login is done.
    st.navigation(PAGES, position="hidden")
    st.stop()
# What a session limited to tenants may not read (every tenant's chains, pipeline, coverage) is not offered.
shown = [page for page in PAGES if session.all_tenants or page.url_path not in GLOBAL_PAGES]
navigation = st.navigation(shown)
if not session.all_tenants and "refusal_told" not in st.session_state:
    # A link to a page this login may not read opens the default page: say why, once, rather than
    # land there without a word.
    st.session_state["refusal_told"] = True
    asked = urlparse(st.context.url or "").path.rstrip("/").rsplit("/", 1)[-1]
    refused = next((page.title for page in PAGES if page.url_path == asked and page not in shown), None)
    if refused is not None:
        st.warning(
            f"{refused} reads every tenant's events and your login reads its own tenant's only, so "
            f"{navigation.title} opened instead. An administrator or auditor login shows {refused}.",
            icon=":material/lock:",
        )
ui.from_url("window", parse=ui.window_label)
ui.from_url("tenant")
ui.from_url("live", parse=lambda text: text not in ("0", "false", "off"))
ui.from_url(ui.AS_OF_KEY)
with st.sidebar:
    st.subheader("callgate audit")
    st.caption("Reading from")
    st.text(cfg.source)
    if cfg.login != "none":
        st.caption("Logged in as")
        st.text(session.subject)
        st.button("Log out", on_click=ui.logout, key="logout")
    if "window" not in st.session_state:
        st.session_state["window"] = DEFAULT_WINDOW
    st.selectbox("Window", list(WINDOWS), key="window")
    held = sorted(session.identity.tenants) if session.identity is not None and not session.all_tenants else []
    if session.tenant is not None:
        st.caption("Tenant (your login reads this tenant only)")
        st.text(session.tenant)
    elif len(held) > 1:
        # A login for several tenants reads one at a time: every query names the one picked here.
        if st.session_state.get("tenant") not in held:
            st.session_state["tenant"] = held[0]
        st.selectbox("Tenant", held, key="tenant", help="Your login reads these tenants, one at a time.")
    else:
        st.text_input(
            "Tenant",
            key="tenant",
            placeholder="all tenants",
            help="Overview, Trends, Run and Policy impact only this tenant.",
        )
    if "live" not in st.session_state:
        st.session_state["live"] = True
    st.toggle("Live", key="live", help=f"Refresh the live parts every {cfg.refresh_s:g} s.")
    no_time_travel = ui.as_of_unavailable()
    if no_time_travel is None:
        st.text_input(
            "As of (ISO 8601, UTC)",
            key=ui.AS_OF_KEY,
            placeholder="now",
            help="A past date and time: every page shows the store as it was then (time travel).",
        )
    else:
        st.text_input("As of", value="", placeholder="now", disabled=True, key="as_of_disabled", help=no_time_travel)
        st.caption(no_time_travel)
    st.caption("Times shown in")
    st.text(ui.zone()[1])
ui.to_url("window", ui.window_code(st.session_state["window"]), ui.window_code(DEFAULT_WINDOW))
ui.to_url("tenant", st.session_state.get("tenant") if session.tenant is None else None)
ui.to_url("live", "0" if not st.session_state["live"] else None)
try:
    past = ui.as_of()
except ValueError:
    st.error("As of is not a time: give an ISO 8601 date and time (2026-12-01T09:30:00), or leave it blank for now.")
    st.stop()
ui.to_url(ui.AS_OF_KEY, past.isoformat() if past is not None else None)
if past is not None:
    shown_at = ui.local_time(past.isoformat())
    st.warning(
        f"Past view: every page shows the store as it was at {shown_at} ({ui.zone()[1]}), not as it is now. "
        "Clear As of in the sidebar to see the store now.",
        icon=":material/history:",
    )
navigation.run()
