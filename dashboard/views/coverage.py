"""Coverage: the checks of `callgate coverage` as they stand, red or green at a glance."""

from __future__ import annotations

import streamlit as st

from dashboard import ui

st.title("Coverage")
st.caption(
    "The checks `callgate coverage` runs in CI, over the sidebar's window: no tool effect outside the gate, "
    "every audit chain whole, every tool run verified, every registered tool exercised."
)


EVERY = ui.run_every()


@st.fragment(run_every=None if EVERY is None else max(EVERY, ui.COVERAGE_TTL_S))
def live() -> None:
    with ui.problems():
        if not ui.ready():
            return
        report = ui.coverage_report(ui.window().since)
        st.caption(f"Checked at {report['checked_at']}; the verdict is kept for a minute.")
        failed = [check for check in report["checks"] if check["status"] == "fail"]
        if report["ok"]:
            st.success("All coverage checks pass.")
        else:
            st.error(f"{len(failed)} of {len(report['checks'])} coverage checks fail.")
        columns = st.columns(len(report["checks"]))
        for column, check in zip(columns, report["checks"], strict=True):
            with column:
                status = {"pass": "PASS", "fail": "FAIL", "skip": "SKIPPED"}.get(check["status"], "?")
                box = {"pass": st.success, "fail": st.error}.get(check["status"], st.info)
                box(f"{status}: {check['name']}")
                st.text(check["title"])
                st.text(check["summary"])
        for check in report["checks"]:
            if check["violations"]:
                st.subheader(f"Violations: {check['name']}")
                st.caption(f"{check['listed']} of {check['total']} listed.")
                ui.table(check["violations"], key=f"violations_{check['name']}")


live()
