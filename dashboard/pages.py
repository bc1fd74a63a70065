"""The console's pages: each one's script, title and path, shared by the app (its menu) and the
server (`dashboard.serve`, which answers each path)."""

from __future__ import annotations

from typing import Final, NamedTuple

__all__ = ["PAGES", "PAGE_PATHS", "ConsolePage"]


class ConsolePage(NamedTuple):
    """A page of the console: its script (relative to `dashboard/`), its title, its URL path."""

    script: str
    title: str
    path: str


PAGES: Final = (
    ConsolePage("views/overview.py", "Overview", "overview"),
    ConsolePage("views/blocked.py", "Blocked attempts", "blocked"),
    ConsolePage("views/call.py", "Call detail", "call"),
    ConsolePage("views/run.py", "Run", "run"),
    ConsolePage("views/approvals.py", "Approvals", "approvals"),
    ConsolePage("views/trends.py", "Trends", "trends"),
    ConsolePage("views/impact.py", "Policy impact", "impact"),
    ConsolePage("views/coverage.py", "Coverage", "coverage"),
    ConsolePage("views/pipeline.py", "Pipeline health", "pipeline"),
)
"""The pages in menu order; the first is the default, served at the root."""

PAGE_PATHS: Final = tuple(page.path for page in PAGES)
"""Every page's path (the default page's too: Streamlit shows it at the root, and at its path)."""
