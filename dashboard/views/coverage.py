"""Coverage: the checks of `callgate coverage` as they stand, red or green at a glance."""

from __future__ import annotations

import streamlit as st

from dashboard import ui
from dashboard.data import SIGNED_COLUMNS

st.title("Coverage")
st.caption(
    "The checks `callgate coverage` runs in CI, over the sidebar's window: no tool effect outside the gate, "
    "every audit chain whole, every tool run verified, every registered tool exercised, and, where producers "
    "sign checkpoints, every producer signed by a trusted key and covered (`--require-signed`)."
)

EVERY = ui.run_every()

STATUS = {"pass": "PASS", "fail": "FAIL", "skip": "SKIPPED", "unavailable": "CANNOT CHECK"}
BOX = {"pass": st.success, "fail": st.error, "unavailable": st.warning}
# Why the signed check is (or is not) listed; the dashboard's own words only.
SIGNATURES = {
    "shown": "The signed check is listed because producers in this window sign checkpoints; "
    "producers without a valid signed checkpoint fail it as `unsigned`.",
    "required": "The signed check is listed because the dashboard requires it (`--require-signed`).",
    "not_used": "No producer in this window signs checkpoints, so the signed check is not listed. "
    "Start the dashboard with `--require-signed` to list it always.",
    "unavailable": "This store predates signed checkpoints: the signed check cannot be made here.",
}
# Per check, the violation columns shown (all of them for the checks not named).
COLUMNS = {"signed": SIGNED_COLUMNS}


@st.fragment(run_every=None if EVERY is None else max(EVERY, ui.COVERAGE_TTL_S))
def live() -> None:
    with ui.problems():
        if not ui.ready():
            return
        report = ui.coverage_report(ui.window().since)
        checked = f"{ui.local_time(report['checked_at'])} ({ui.zone()[1]})"
        st.caption(f"Checked at {checked}; the verdict is kept for a minute.")
        failed = [check for check in report["checks"] if check["status"] == "fail"]
        unchecked = [check for check in report["checks"] if check["status"] == "unavailable"]
        if report["ok"]:
            st.success("All coverage checks pass.")
        elif failed:
            st.error(f"{len(failed)} of {len(report['checks'])} coverage checks fail.")
        if unchecked:
            st.warning(f"{len(unchecked)} of {len(report['checks'])} coverage checks cannot be made on this store.")
        st.caption(SIGNATURES.get(report.get("signatures", ""), ""))
        columns = st.columns(len(report["checks"]))
        for column, check in zip(columns, report["checks"], strict=True):
            with column:
                BOX.get(check["status"], st.info)(f"{STATUS.get(check['status'], '?')}: {check['name']}")
                st.text(check["title"])
                st.text(check["summary"])
        for check in report["checks"]:
            if check["violations"]:
                st.subheader(f"Violations: {check['name']}")
                st.caption(f"{check['listed']} of {check['total']} listed.")
                ui.table(check["violations"], COLUMNS.get(check["name"]), key=f"violations_{check['name']}")


live()
