"""Trends: denial rate per tool and per interceptor over time, a series per tool, tenant, policy rule
or interceptor; over the sidebar's window or a custom range; denial reasons new in the range."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import streamlit as st

from dashboard import ui
from dashboard.data import DECISION_LABELS, TREND_DIMENSIONS, Window, bucket_label, load_trends

st.title("Trends")

TOP_KEYS = 10
RANGES = ["The sidebar's window", "Custom range"]


def rate_chart(
    rows: list[dict[str, Any]], what: tuple[str, str], seconds: int, *, total: int | None = None, width_px: int
) -> None:
    """The rate of the `TOP_KEYS` keys with the most denials over time, and their totals. `what`: the
    key's name, singular and plural; `total`: the common denominator (all calls of the range) for keys
    whose rows count every call of a bucket."""
    if not rows:
        st.caption(
            "No calls in this window." if what[0] != "policy rule" else "No policy rule denied a call in this range."
        )
        return
    frame = ui.frame(rows, ["bucket", "key", "calls", "denied", "rate"])
    totals = frame.groupby("key", as_index=False)[["calls", "denied"]].sum()
    if total is not None:
        totals["calls"] = total
    totals["rate"] = (totals["denied"] / totals["calls"].where(totals["calls"] > 0)).round(4)
    totals = totals.sort_values(["denied", "key"], ascending=[False, True])
    shown = totals.head(TOP_KEYS)["key"].tolist()
    picked = frame[frame["key"].isin(shown)].rename(columns={"key": what[0]})
    ui.time_chart(picked.to_dict("records"), value="rate", color=what[0], seconds=seconds, title="rate", rate=True)
    count = min(TOP_KEYS, len(totals))
    st.caption(
        f"The {what[0] if count == 1 else f'{count} {what[1]}'} with the most denials; totals over the range below."
    )
    columns = ["key", "denied", "calls", "rate"]
    if total is not None:
        totals = totals.rename(columns={"calls": "all calls", "rate": "share of all calls"})
        columns = ["key", "denied", "all calls", "share of all calls"]
    ui.table(totals.to_dict("records"), columns, width_px=width_px, headers={"key": what[0]})


def _moment(day: date | None, at: time | None) -> datetime | None:
    return None if day is None else datetime.combine(day, at or time(0), tzinfo=UTC)


def chosen_range() -> tuple[Window, datetime | None] | None:
    """The sidebar's window, or the custom range typed here (UTC); None (said why) for an empty range."""
    if st.radio("Range", RANGES, horizontal=True, key="trends_range") == RANGES[0]:
        return ui.window(), None
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    start_default = now - timedelta(days=1)
    cols = st.columns(4)
    start_day = cols[0].date_input("Start date (UTC)", value=start_default.date(), key="trends_start_day")
    start_at = cols[1].time_input("Start time (UTC)", value=start_default.time(), key="trends_start_time")
    end_day = cols[2].date_input("End date (UTC)", value=now.date(), key="trends_end_day")
    end_at = cols[3].time_input("End time (UTC)", value=now.time(), key="trends_end_time")
    start = _moment(start_day if isinstance(start_day, date) else None, start_at)
    end = _moment(end_day if isinstance(end_day, date) else None, end_at)
    if start is None or end is None or start >= end:
        st.error("The range's start must come before its end.")
        return None
    label = f"{start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC"
    return Window(label, None, start), end


picked_range = chosen_range()
dimension = st.selectbox("Series over time per", list(TREND_DIMENSIONS), index=1, key="trends_by")


@st.fragment(run_every=ui.run_every() if picked_range is not None and picked_range[1] is None else None)
def live() -> None:
    with ui.problems():
        if picked_range is None or not ui.ready():
            return
        win, until = picked_range
        by = TREND_DIMENSIONS[dimension]
        data = load_trends(ui.query, win, ui.filters_tenant(), until=until, by=by)
        st.caption(f"{win.label}, {bucket_label(data.bucket_seconds)} buckets fitted to the span of the data.")
        left, right = st.columns(2)
        with left:
            st.subheader("Denial rate per tool")
            st.caption("Share of each tool's calls in a bucket that were denied or blocked.")
            rate_chart(data.by_tool, ("tool", "tools"), data.bucket_seconds, width_px=ui.HALF_WIDTH_PX)
        with right:
            st.subheader("Denial rate per interceptor")
            st.caption(
                f"Share of all calls ({data.total_calls:,} in the range; per bucket, the bucket's) that the "
                "interceptor denied or blocked: one denominator for every interceptor."
            )
            rate_chart(
                data.by_interceptor,
                ("interceptor", "interceptors"),
                data.bucket_seconds,
                total=data.total_calls,
                width_px=ui.HALF_WIDTH_PX,
            )
        st.subheader(f"Denial rate per {dimension.lower()}")
        if by in ("tool", "tenant"):
            st.caption(f"Share of each {dimension.lower()}'s calls in a bucket that were denied or blocked.")
        else:
            st.caption(f"Share of all calls in a bucket that the {dimension.lower()} denied or blocked.")
        noun = dimension.lower()
        rate_chart(
            data.series,
            (noun, f"{noun}s"),
            data.bucket_seconds,
            total=None if by in ("tool", "tenant") else data.total_calls,
            width_px=ui.PAGE_WIDTH_PX,
        )
        st.subheader("Denial reasons new in this window")
        st.caption("Reasons with ids and numbers masked, first seen inside the range, newest first.")
        # The decision in words, not its event type.
        reasons = [{**row, "type": DECISION_LABELS.get(row.get("type"), row.get("type"))} for row in data.new_reasons]
        ui.table(
            reasons,
            ["first_seen", "reason", "type", "decided_by", "occurrences", "tenants", "sample_tool", "sample_message"],
            empty="No new denial reason in this window.",
            headers={"type": "decision"},
        )


live()
