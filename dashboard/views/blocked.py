"""Blocked attempts: denied and blocked calls, filtered, newest first, paged by the store; CSV export."""

from __future__ import annotations

from typing import Any

import streamlit as st

from dashboard import ui
from dashboard.data import BLOCKED_TABLE_COLUMNS, DECISION_LABELS, BlockedFilters, blocked_csv, load_blocked

st.title("Blocked attempts")

KINDS = ["Denied and blocked", "ToolDenied", "Blocked"]
PAGE_SIZES = [50, 100, 500, 1000]
TEXT_FILTERS = ("f_since", "f_until", "f_decided_by", "f_tenant", "f_principal", "f_agent", "f_tool", "f_text")


def _choice(options: list[Any]) -> Any:
    def parse(text: str) -> Any:
        for option in options:
            if str(option) == text:
                return option
        raise ValueError(text)

    return parse


# A shared link restores the filters, the page and the picked call (?f_tenant=acme&page=2&call=...).
for key in TEXT_FILTERS:
    ui.from_url(key)
ui.from_url("f_type", parse=_choice(KINDS))
ui.from_url("page_size", parse=_choice(PAGE_SIZES))
ui.from_url("page", parse=ui.page_number)
# Back from another page (a call, its run), the filters are as the user left them.
KEPT = (*TEXT_FILTERS, "f_type", "page_size", "page")
ui.keep(*KEPT)

# Collapsed, so that on a phone the first screen shows the results; the active filters are named below it,
# as text. The page size and the CSV export are in it too; the page number stays out.
filter_box = st.expander("Filters, page size and CSV", expanded=False)
with filter_box:
    row1 = st.columns(4)
    since = row1[0].text_input("From (ISO 8601, UTC)", key="f_since", placeholder="the sidebar's window")
    until = row1[1].text_input("To (ISO 8601, UTC)", key="f_until", placeholder="now")
    kind = row1[2].selectbox(
        "Decision", KINDS, key="f_type", format_func=lambda choice: DECISION_LABELS.get(choice, choice).capitalize()
    )
    decided_by = row1[3].text_input("Interceptor", key="f_decided_by")
    row2 = st.columns(4)
    tenant = row2[0].text_input("Tenant", key="f_tenant")
    principal = row2[1].text_input("Principal", key="f_principal")
    agent = row2[2].text_input("Agent", key="f_agent")
    tool = row2[3].text_input("Tool", key="f_tool")
    text = st.text_input("Reason contains", key="f_text", help="Case-insensitive, literal text (no wildcards).")
active = {
    "from": since,
    "to": until,
    "decision": "" if kind == KINDS[0] else kind,
    "interceptor": decided_by,
    "tenant": tenant,
    "principal": principal,
    "agent": agent,
    "tool": tool,
    "reason contains": text,
}
named = [f"{name} {value}" for name, value in active.items() if value]
if named:
    st.text("Filtered by " + ", ".join(named) + ".")

win = ui.window()
filters = BlockedFilters(
    since=since or (win.since.isoformat() if win.since is not None else None),
    until=until,
    tenant=tenant,
    principal=principal,
    agent=agent,
    tool=tool,
    type=None if kind == "Denied and blocked" else kind,
    decided_by=decided_by,
    text=text,
)
if "page_size" not in st.session_state:
    st.session_state["page_size"] = 100
# The CSV is made when it is downloaded, off this run: it reads as the session that drew the button.
read_as_this_session = ui.query_as(ui.access())
with filter_box:
    controls = st.columns([1, 3])
    page_size = controls[0].selectbox("Rows per page", PAGE_SIZES, key="page_size")
    with controls[1]:
        st.write("")
        st.download_button(
            "Download CSV of this filter",
            data=lambda: blocked_csv(read_as_this_session, filters),
            file_name="blocked-attempts.csv",
            mime="text/csv",
            on_click="ignore",
            help="Every matching attempt (up to 100,000), newest first.",
        )
page_number = int(st.columns([1, 3])[0].number_input("Page", min_value=1, step=1, key="page"))
ui.kept(*KEPT)
for key in TEXT_FILTERS:
    ui.to_url(key, st.session_state.get(key))
ui.to_url("f_type", kind, KINDS[0])
ui.to_url("page_size", page_size, 100)
ui.to_url("page", page_number, 1)


def _pin_selected() -> None:
    """A row was selected or cleared: keep the call id of the row the user saw (the page as last
    drawn), not its position, which the next live refresh gives to another call."""
    event = st.session_state.get("blocked_table")
    picked = list(event["selection"]["rows"]) if event is not None else []
    drawn = st.session_state.get("blocked_drawn", [])
    st.session_state["blocked_pinned"] = drawn[picked[0]] if picked and picked[0] < len(drawn) else None


pinned = st.session_state.get("blocked_pinned")
# While a row is selected, Live pauses: the rows stay where the user saw them until the selection is cleared.
live_every = None if pinned else ui.run_every()


@st.fragment(run_every=live_every)
def live() -> None:
    with ui.problems():
        if not ui.ready():
            return
        result = load_blocked(ui.query, filters, page=page_number, page_size=int(page_size))
        figures = st.columns(3)
        figures[0].metric("Matching attempts", f"{int(result.count.get('attempts') or 0):,}")
        figures[1].metric("Denied", f"{int(result.count.get('denied') or 0):,}")
        figures[2].metric("Blocked", f"{int(result.count.get('blocked') or 0):,}")
        st.caption(f"Page {result.page} of {result.pages}, newest first. Select a row to open the call.")
        if live_every is None and pinned and st.session_state.get("live", True):
            st.caption("Live is paused while a row is selected; clear the selection to resume.")
        event = ui.table(
            # The decision in words, not its event type (the CSV keeps the type).
            [{**row, "type": DECISION_LABELS.get(row.get("type"), row.get("type"))} for row in result.rows],
            BLOCKED_TABLE_COLUMNS,
            headers={"type": "decision"},
            key="blocked_table",
            selectable=True,
            empty="No attempt matches.",
            on_select=_pin_selected,
        )
        st.session_state["blocked_drawn"] = [row.get("call_id") for row in result.rows]
        if event is None or not event.selection.rows:
            # No row selected (none yet, or the page drawn afresh on the way back): nothing is pinned.
            st.session_state["blocked_pinned"] = None
        selected = st.session_state.get("blocked_pinned")
        if bool(selected) != bool(pinned):
            # Selected or cleared: run the page again so Live pauses or resumes.
            st.rerun()
        calls = list(dict.fromkeys(row["call_id"] for row in result.rows if row.get("call_id")))
        linked = st.query_params.get("call")
        if "blocked_call" not in st.session_state and linked in calls:
            st.session_state["blocked_call"] = linked
        choice = st.selectbox(
            "Call", calls, index=None, placeholder="pick a call of this page, or select a row", key="blocked_call"
        )
        target = selected or choice
        ui.to_url("call", target)
        if selected:
            st.text(f"Selected call: {selected}")
        runs = {row["call_id"]: row.get("run_id") for row in result.rows if row.get("call_id")}
        run_of_target = runs.get(target) if target is not None else None
        buttons = st.columns([1, 1, 4])
        if buttons[0].button("Open call detail", disabled=target is None):
            st.session_state["open_call_id"] = target
            st.switch_page("views/call.py")
        if buttons[1].button("Open its run", disabled=not run_of_target, key="blocked_open_run"):
            st.session_state["open_run_id"] = run_of_target
            st.switch_page("views/run.py")


live()
