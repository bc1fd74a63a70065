"""What `callgate dashboard` serves: the console (`dashboard/app.py`) as a Streamlit `st.App`, whose
page paths (`/call`, `/run`, ...) answer with Streamlit's page telling the browser where the server is.

Opened at a page's path, Streamlit's page looks for its server first under that path
(`/call/_stcore/health`, `/call/_stcore/host-config`: two 404s) and only then at the root. Its own
setting `window.__streamlit.BACKEND_BASE_URL` names the server's address instead; each page path
serves Streamlit's page with that setting first, the address of the folder the page is in (so a
proxy that serves the console under a prefix still works).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Final

import streamlit as st
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Route
from streamlit import file_util

from dashboard.pages import PAGE_PATHS

__all__ = ["BASE_URL_SCRIPT", "app", "page_html"]

BASE_URL_SCRIPT: Final = (
    "<script>window.__streamlit = {BACKEND_BASE_URL: new URL('.', window.location.href).href}</script>"
)
"""Names the server's address (the page path's folder) before Streamlit's own script runs."""


@cache
def page_html() -> str:
    """Streamlit's page with `BASE_URL_SCRIPT` at the start of its head."""
    page = (Path(file_util.get_static_dir()) / "index.html").read_text(encoding="utf-8")
    head = page.index("<head>") + len("<head>")
    return page[:head] + BASE_URL_SCRIPT + page[head:]


async def _page(request: Request) -> HTMLResponse:
    return HTMLResponse(page_html(), headers={"Cache-Control": "no-cache"})


app = st.App("app.py", routes=[Route(f"/{path}", _page, methods=["GET", "HEAD"]) for path in PAGE_PATHS])
