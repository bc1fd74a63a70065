"""Trends: denial rate per tool and per interceptor over time; denial reasons new in the window."""

from __future__ import annotations

from typing import Any

import streamlit as st

from dashboard import ui
from dashboard.data import bucket_label, load_trends

st.title("Trends")

TOP_KEYS = 10


def rate_chart(rows: list[dict[str, Any]], what: str, seconds: int) -> None:
    if not rows:
        st.caption("No calls in this window.")
        return
    frame = ui.frame(rows, ["bucket", "key", "calls", "denied", "rate"])
    totals = frame.groupby("key", as_index=False)[["calls", "denied"]].sum()
    totals["rate"] = (totals["denied"] / totals["calls"].where(totals["calls"] > 0)).round(4)
    totals = totals.sort_values(["denied", "key"], ascending=[False, True])
    shown = totals.head(TOP_KEYS)["key"].tolist()
    picked = frame[frame["key"].isin(shown)]
    ui.time_chart(picked.to_dict("records"), value="rate", color="key", seconds=seconds, title="rate", rate=True)
    st.caption(f"The {min(TOP_KEYS, len(totals))} {what} with the most denials; totals over the window below.")
    ui.table(totals.to_dict("records"), ["key", "calls", "denied", "rate"])


@st.fragment(run_every=ui.run_every())
def live() -> None:
    with ui.problems():
        if not ui.ready():
            return
        win = ui.window()
        data = load_trends(ui.query, win, ui.filters_tenant())
        st.caption(f"{win.label}, {bucket_label(data.bucket_seconds)} buckets fitted to the span of the data.")
        left, right = st.columns(2)
        with left:
            st.subheader("Denial rate per tool")
            rate_chart(data.by_tool, "tools", data.bucket_seconds)
        with right:
            st.subheader("Denial rate per interceptor")
            st.caption("Share of all calls in a bucket that the interceptor denied or blocked.")
            rate_chart(data.by_interceptor, "interceptors", data.bucket_seconds)
        st.subheader("Denial reasons new in this window")
        st.caption("Reasons with ids and numbers masked, first seen inside the window, newest first.")
        ui.table(
            data.new_reasons,
            ["first_seen", "reason", "decided_by", "occurrences", "tenants", "sample_tool", "sample_message", "type"],
            empty="No new denial reason in this window.",
        )


live()
