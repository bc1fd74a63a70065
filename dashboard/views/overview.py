"""Overview: the window's figures against the window before, decisions over time, top denied."""

from __future__ import annotations

import streamlit as st

from dashboard import ui
from dashboard.data import TOP_DENIED, load_overview

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

        st.subheader("Decisions over time")
        if data.trends:
            frame = ui.frame(data.trends, ["bucket", "type", "events"])
            st.bar_chart(frame, x="bucket", y="events", color="type", stack=True, x_label="", y_label="events")
            st.caption(f"Events per {data.bucket_minutes}-minute bucket, by type.")
        else:
            st.caption("No events in this window.")

        st.subheader("Top denied")
        for start in range(0, len(TOP_DENIED), 2):
            columns = st.columns(2)
            for column, (by, heading) in zip(columns, TOP_DENIED[start : start + 2], strict=False):
                with column:
                    st.markdown(f"**{heading}**")
                    ui.table(
                        data.top[by],
                        ["key", "attempts", "denied", "blocked", "last_seen", "last_message"],
                        empty="No denials in this window.",
                    )


live()
