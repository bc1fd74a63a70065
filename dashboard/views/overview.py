"""Overview: the window's figures against the window before, decisions over time, top denied."""

from __future__ import annotations

import streamlit as st

from dashboard import ui
from dashboard.data import TOP_DENIED, bucket_label, load_overview

st.title("Overview")


@st.fragment(run_every=ui.run_every())
def live() -> None:
    with ui.problems():
        if not ui.ready():
            return
        win = ui.window()
        data = load_overview(ui.query, win, ui.filters_tenant())
        st.caption(f"{win.label}" + (", compared with the window of the same length before it" if win.compares else ""))
        for start in range(0, len(data.metrics), 5):
            columns = st.columns(5)
            for column, metric in zip(columns, data.metrics[start : start + 5], strict=False):
                delta = int(metric["change"]) if win.compares else None
                # More calls is neutral; more of anything else here is worse.
                color = "off" if metric["metric"] in ("calls", "allowed") else "inverse"
                column.metric(metric["label"], f"{int(metric['value']):,}", delta=delta, delta_color=color)

        st.subheader("Tool decisions over time")
        label = bucket_label(data.bucket_seconds)
        if data.decisions:
            ui.time_chart(data.decisions, value="events", color="decision", seconds=data.bucket_seconds, title="calls")
            st.caption(f"Calls per {label} bucket, by decision (the bucket fits the window and the span of its data).")
        else:
            st.caption("No tool calls in this window.")
        if data.turns:
            st.subheader("Model turns checked")
            # One series, named in words rather than by its event type.
            turns = [{**row, "checked": "before-turn decisions"} for row in data.turns]
            ui.time_chart(turns, value="events", color="checked", seconds=data.bucket_seconds, title="turns")
            st.caption(f"Before-turn decisions on model calls per {label} bucket (the Run page shows each one).")

        st.subheader("Top denied")
        for start in range(0, len(TOP_DENIED), 2):
            columns = st.columns(2)
            for column, (by, heading) in zip(columns, TOP_DENIED[start : start + 2], strict=False):
                with column:
                    st.markdown(f"**{heading}**")
                    # Half a page wide: who, how often, how lately; the messages are on Blocked attempts.
                    ui.table(
                        data.top[by],
                        ["key", "denied", "blocked", "last_seen"],
                        empty="No denials in this window.",
                        width_px=ui.HALF_WIDTH_PX,
                        headers={"key": ui.HEADERS.get(by, by)},
                    )


live()
