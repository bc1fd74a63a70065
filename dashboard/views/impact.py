"""Policy impact: what shadow rules and shadow interceptors would have done, had they been enforced."""

from __future__ import annotations

import streamlit as st

from dashboard import ui
from dashboard.data import (
    IMPACT_COLUMNS,
    SHADOW_CALL_COLUMNS,
    Decider,
    Impact,
    Window,
    bucket_label,
    load_impact,
    load_shadow_calls,
    replay_command,
)

st.title("Policy impact")
st.caption(
    "What shadow rules and shadow interceptors would have done to the calls of the window had they been "
    "enforced. They are evaluated and recorded on every call they meet, and applied to none."
)

EMPTY = (
    "No call in this window met a shadow decision. To see what a new or stricter rule would do before "
    "enforcing it, give the rule `mode: shadow` in its policy file (or the whole file `mode: shadow`), or wrap a "
    "Python interceptor in `interceptor_core.shadow(...)`: it is then evaluated on every call and applied to "
    "none, and this page shows where it would have changed the outcome. See docs/policies.md."
)
ALL_CALLS = "__all__"
TOP_DECIDERS = 10
MAX_REPLAYS = 20


def divergence_chart(impact: Impact) -> None:
    if not any(int(row["divergent"]) for row in impact.divergence):
        st.caption("No shadow decision differed from what happened in this window.")
        return
    shown = [d.label for d in impact.deciders[:TOP_DECIDERS]]
    frame = ui.frame(impact.divergence, ["bucket", "key", "calls", "divergent"])
    frame = frame[frame["key"].isin(shown)].rename(columns={"key": "rule or interceptor"})
    ui.time_chart(
        frame.to_dict("records"),
        value="divergent",
        color="rule or interceptor",
        seconds=impact.bucket_seconds,
        title="divergent calls",
    )
    st.caption(
        f"Calls whose shadow outcome differs from what happened, per {bucket_label(impact.bucket_seconds)} bucket, "
        + (
            "for the one rule or interceptor."
            if len(shown) == 1
            else f"for the {len(shown)} most divergent rules and interceptors."
        )
    )


def replays(impact: Impact, window: Window) -> None:
    cfg = ui.config()
    st.caption(
        "Each command replays the stored calls of this window through the candidate and reports what would "
        "change. The store keeps a policy's name and version, not its path, nor where an interceptor is "
        "defined: fill in POLICY_FILE or MODULE:ATTR."
    )
    # One command per policy file (its rules replay together) and per interceptor.
    files: dict[tuple[str, bool], list[Decider]] = {}
    for decider in impact.deciders:
        files.setdefault((decider.name, decider.is_policy), []).append(decider)
    for (name, is_policy), deciders in list(files.items())[:MAX_REPLAYS]:
        divergent = sum(d.divergent for d in deciders)
        calls = sum(d.calls for d in deciders)
        if is_policy:
            rules = ", ".join(str(d.rule) for d in deciders)
            st.text(f"Policy file {name!r}, rules {rules}: {divergent:,} divergent of {calls:,} calls")
        else:
            st.text(f"Interceptor {name!r}: {divergent:,} divergent of {calls:,} calls")
        command = replay_command(deciders[0], window, api=cfg.api, db=None if cfg.api else str(cfg.db))
        st.code(command, language="bash")
    if len(files) > MAX_REPLAYS:
        st.caption(f"The {MAX_REPLAYS} most divergent of {len(files)} shown.")


def calls_behind(impact: Impact, window: Window, tenant: str | None) -> None:
    options = [ALL_CALLS, *(d.key for d in impact.deciders)]
    labels = {d.key: f"{d.label}: {d.divergent:,} divergent of {d.calls:,}" for d in impact.deciders}
    labels[ALL_CALLS] = f"Every call with a shadow outcome ({impact.total('calls'):,})"
    # A shared link restores the choice, the toggle and the page (?decider=...&divergent=0&i_page=2&call=...).
    ui.from_url("impact_decider", "decider")
    ui.from_url("impact_divergent_only", "divergent", parse=lambda text: text not in ("0", "false", "off"))
    ui.from_url("impact_page_size", "i_page_size", parse=lambda text: {"50": 50, "100": 100, "500": 500}[text])
    ui.from_url("impact_page", "i_page", parse=ui.page_number)
    st.session_state.setdefault("impact_divergent_only", True)
    st.session_state.setdefault("impact_page_size", 100)
    # The most divergent decider first; a choice that left the window falls back to it.
    if st.session_state.get("impact_decider") not in options:
        st.session_state["impact_decider"] = options[1] if len(options) > 1 else ALL_CALLS
    controls = st.columns([3, 1, 1, 1])
    choice = controls[0].selectbox("Rule or interceptor", options, format_func=labels.__getitem__, key="impact_decider")
    divergent_only = controls[1].toggle("Only divergent", key="impact_divergent_only")
    page_size = int(controls[2].selectbox("Rows per page", [50, 100, 500], key="impact_page_size"))
    page = int(controls[3].number_input("Page", min_value=1, step=1, key="impact_page"))
    ui.to_url("decider", choice, options[1] if len(options) > 1 else ALL_CALLS)
    ui.to_url("divergent", None if divergent_only else "0")
    ui.to_url("i_page_size", page_size, 100)
    ui.to_url("i_page", page, 1)
    name, rule = (None, None) if choice == ALL_CALLS else Decider.parse_key(choice)
    result = load_shadow_calls(
        ui.query,
        window,
        impact,
        tenant,
        decider=name,
        rule=rule,
        divergent_only=divergent_only,
        page=page,
        page_size=page_size,
    )
    st.caption(f"Page {result.page} of {result.pages}, {result.total:,} calls, newest first. Select a row to open it.")
    event = ui.table(
        result.rows, SHADOW_CALL_COLUMNS, key="impact_calls", selectable=True, empty="No call matches this choice."
    )
    picked = list(event.selection.rows) if event is not None else []
    selected = result.rows[picked[0]].get("call_id") if picked and picked[0] < len(result.rows) else None
    calls = list(dict.fromkeys(row["call_id"] for row in result.rows if row.get("call_id")))
    linked = st.query_params.get("call")
    if "impact_call" not in st.session_state and linked in calls:
        st.session_state["impact_call"] = linked
    other = st.selectbox(
        "Call", calls, index=None, placeholder="pick a call of this page, or select a row", key="impact_call"
    )
    target = selected or other
    ui.to_url("call", target)
    if selected:
        st.text(f"Selected call: {selected}")
    if st.button("Open call detail", disabled=target is None, key="impact_open"):
        st.session_state["open_call_id"] = target
        st.switch_page("views/call.py")


@st.fragment(run_every=ui.run_every())
def live() -> None:
    with ui.problems():
        if not ui.ready():
            return
        win = ui.window()
        tenant = ui.filters_tenant()
        impact = load_impact(ui.query, win, tenant)
        if not impact.rows:
            st.info(EMPTY)
            return
        figures = st.columns(6)
        figures[0].metric("Calls with a shadow outcome", f"{impact.total('calls'):,}")
        figures[1].metric("Divergent", f"{impact.total('divergent'):,}")
        figures[2].metric("Would deny", f"{impact.total('would_deny'):,}")
        figures[3].metric("Would block", f"{impact.total('would_block'):,}")
        figures[4].metric("Would substitute", f"{impact.total('would_substitute'):,}")
        figures[5].metric("Would ask a human", f"{impact.total('would_ask'):,}")
        st.caption(
            f"{win.label}. Divergent: the shadow outcome differs from what happened. Calls whose shadow outcome the "
            "enforced chain decided are counted as (the enforced chain)."
        )

        st.subheader("Divergence over time")
        divergence_chart(impact)

        st.subheader("Impact per rule, tool and tenant")
        ui.table(impact.rows, IMPACT_COLUMNS, key="impact_table")

        st.subheader("Replay over this window")
        replays(impact, win)

        st.subheader("The calls behind the counts")
        calls_behind(impact, win, tenant)


live()
