"""Run: one agent run's story in order (turns, calls with their decision trails, nested agents under
the call that started them, approvals and who decided, the final outcome), and the search for runs
by run id, principal or thread. `?run_id=` links work, and so do the search's filters."""

from __future__ import annotations

import streamlit as st

from dashboard import ui
from dashboard.data import RUN_COLUMNS, RUN_OUTCOMES, STORY_COLUMNS, RunFilters, RunStory, load_run, load_runs

st.title("Run")

# A run opened from a call, a blocked attempt or the search below; or a shared link (?run_id=...).
if "open_run_id" in st.session_state:
    st.session_state["run_id"] = st.session_state.pop("open_run_id")
ui.from_url("run_id")
for key in ("r_run", "r_principal", "r_thread"):
    ui.from_url(key)
ui.from_url("r_page", parse=ui.page_number)
# Back from another page, the search is as the user left it.
ui.keep("r_run", "r_principal", "r_thread", "r_page")

with st.expander("Find a run", expanded=not st.session_state.get("run_id")):
    row = st.columns(4)
    run_prefix = row[0].text_input("Run id starts with", key="r_run")
    principal = row[1].text_input("Principal", key="r_principal")
    thread = row[2].text_input("Thread", key="r_thread")
    page_number = int(row[3].number_input("Page", min_value=1, step=1, key="r_page"))
for key, value in (("r_run", run_prefix), ("r_principal", principal), ("r_thread", thread)):
    ui.to_url(key, value)
ui.to_url("r_page", page_number, 1)
ui.kept("r_run", "r_principal", "r_thread", "r_page")

run_id = st.text_input("Run id", key="run_id", placeholder="paste a run id, pick one below, or open one from a call")
run_id = run_id.strip()
ui.to_url("run_id", run_id)


def search() -> None:
    filters = RunFilters(run_id=run_prefix, principal=principal, thread_id=thread, tenant=ui.filters_tenant())
    result = load_runs(ui.query, ui.window(), filters, page=page_number, page_size=50)
    more = " More on the next page." if result.more else ""
    st.caption(f"Runs with an event in the window, newest first; page {result.page}.{more} Select a row to open it.")
    event = ui.table(result.rows, RUN_COLUMNS, key="runs_table", selectable=True, empty="No run matches.")
    picked = list(event.selection.rows) if event is not None else []
    if picked and picked[0] < len(result.rows):
        chosen = str(result.rows[picked[0]]["run_id"])
        if chosen != run_id and st.button("Open run", key="runs_open", type="primary"):
            st.session_state["open_run_id"] = chosen
            st.rerun()


def story(detail: RunStory) -> None:
    if not detail.events:
        st.warning("No stored event has this run id.")
        return
    st.subheader("Outcome")
    outcome_box = st.error if detail.outcome in ("blocked", "turn_denied") else st.info
    outcome_box(RUN_OUTCOMES[detail.outcome])
    if detail.deciding is not None:
        ui.table(
            [detail.deciding],
            ["time", "type", "tool", "agent", "decided_by", "turn", "turn_decision", "call_id", "run_id"],
            key="run_deciding",
        )
        if detail.deciding.get("message"):
            st.caption("Its message or reason (as stored, shown as text)")
            st.code(detail.deciding["message"], language=None, wrap_lines=True)
    figures = st.columns(5)
    figures[0].metric("Turns", detail.count("turn"))
    figures[1].metric("Calls", detail.count("call"))
    figures[2].metric("Approvals", detail.count("approval"))
    figures[3].metric("Nested runs", len(detail.nested_runs))
    figures[4].metric("Events", len(detail.events))
    who = detail.who
    ui.table([{"run_id": detail.run_id, **who}], ["run_id", "tenant", "principal", "thread_id", "gate"], key="run_who")

    st.subheader("Story")
    st.caption(
        "In order: model turns (before-turn decisions), tool calls with their decision trails, approvals and who "
        "answered; an agent used as a tool, or started by one, is indented under the call that ran it."
    )
    st.code(
        "\n".join(
            f"{'    ' * step['depth']}{step['step']}: {step['decision'] or ''}"
            + (f" [{step['decided_by']}]" if step.get("decided_by") else "")
            for step in detail.steps
        ),
        language=None,
    )
    rows = [
        {**step, "step": "  " * step["depth"] + ("- " if step["depth"] else "") + step["step"]} for step in detail.steps
    ]
    event = ui.table(rows, STORY_COLUMNS, key="run_story", selectable=True)
    picked = list(event.selection.rows) if event is not None else []
    calls = list(dict.fromkeys(str(s["call_id"]) for s in detail.steps if s.get("call_id")))
    selected = detail.steps[picked[0]].get("call_id") if picked and picked[0] < len(detail.steps) else None
    choice = st.selectbox(
        "Call", calls, index=None, placeholder="pick a call of this run, or select a row", key="run_call"
    )
    target = selected or choice
    if st.button("Open call detail", disabled=target is None, key="run_open_call"):
        st.session_state["open_call_id"] = target
        st.switch_page("views/call.py")
    if detail.nested_runs:
        st.caption("Runs nested under this run's calls, with run ids of their own")
        st.code("\n".join(detail.nested_runs), language=None)


@st.fragment(run_every=ui.run_every())
def live() -> None:
    with ui.problems():
        if not ui.ready():
            return
        # With a run open, its story comes first; the runs found stay a click away.
        with st.expander("Runs found", expanded=not run_id):
            search()
        if run_id:
            story(load_run(ui.query, run_id, ui.filters_tenant()))


live()
