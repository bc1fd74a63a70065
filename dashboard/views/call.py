"""Call detail: one call's decision trail, redacted args, outcome and trace, and the inclusion proof
of its events (the "Proof" button)."""

from __future__ import annotations

import json
import re

import streamlit as st

from consumers.queries import QueryError
from dashboard import ui
from dashboard.data import CallDetail, call_evidence, call_proofs, load_call

st.title("Call detail")

# A call opened from the Blocked attempts page, or a shared link (?call_id=...).
if "open_call_id" in st.session_state:
    st.session_state["call_id"] = st.session_state.pop("open_call_id")
elif "call_id" not in st.session_state and st.query_params.get("call_id"):
    st.session_state["call_id"] = st.query_params["call_id"]
call_id = st.text_input(
    "Call id", key="call_id", placeholder="paste a call id, or open one from Blocked attempts or Policy impact"
)
call_id = call_id.strip()
if call_id:
    st.query_params["call_id"] = call_id
elif "call_id" in st.query_params:
    del st.query_params["call_id"]


def show(detail_call_id: str) -> None:
    cfg = ui.config()
    detail = load_call(ui.query, detail_call_id)
    if not detail.events:
        st.warning("No stored event has this call id.")
        return
    outcome = detail.outcome
    head = outcome or detail.events[0]

    st.subheader("Outcome")
    figures = st.columns(4)
    figures[0].metric("Outcome event", "stored" if outcome else "not stored yet")
    figures[1].metric("Events of this call", len([e for e in detail.events if e["relation"] == "call"]))
    figures[2].metric("Child call events", len([e for e in detail.events if e["relation"] == "child"]))
    figures[3].metric("Decision steps", len(detail.trail))
    ui.table(
        [head],
        ["type", "outcome", "decided_by", "tool", "agent", "tenant", "principal", "time"],
        key="call_outcome",
    )
    deciding = detail.deciding_step or {}
    st.caption("What decided: the interceptor, and for a policy file the rule and the file's version (SHA-256)")
    st.code(
        "\n".join(
            [
                f"decided by      {head.get('decided_by') or '(no interceptor: the call was allowed)'}",
                f"rule            {deciding.get('rules') or '(none: the decider is code, not a policy rule)'}",
                f"policy version  {deciding.get('policy_version') or '(none: not a policy file)'}",
                f"gate / workflow {head.get('gate') or ''} / {head.get('workflow') or ''}",
            ]
        ),
        language=None,
    )
    run_of_call = head.get("run_id")
    if run_of_call and st.button("Open its run", key="call_open_run", help="The whole run this call was made in."):
        st.session_state["open_run_id"] = str(run_of_call)
        st.switch_page("views/run.py")
    if head.get("message"):
        st.caption("Message the model got, or the block reason (as stored, shown as text)")
        st.code(head["message"], language=None, wrap_lines=True)
    if head.get("shadow_outcome"):
        st.caption("What the shadow decisions would have done (recorded, not applied)")
        ui.table([head], ["shadow_outcome", "divergent", "shadow_decided_by", "shadow_rule"], key="call_shadow")

    st.subheader("Decision trail")
    if detail.trail:
        ui.table(
            detail.trail,
            ["step", "interceptor", "decision", "rules", "mode", "phase", "duration_ms", "error"],
            key="call_trail",
        )
        frame = ui.frame(detail.trail, ["step", "interceptor", "decision", "mode", "start_ms", "duration_ms"])
        frame["end_ms"] = frame["start_ms"] + frame["duration_ms"]
        frame["label"] = frame["step"].astype(str) + ". " + frame["interceptor"].astype(str)
        import altair as alt

        chart = (
            alt.Chart(frame)
            .mark_bar()
            .encode(
                x=alt.X("start_ms:Q", title="ms since the first step"),
                x2="end_ms:Q",
                y=alt.Y("label:N", sort=None, title=None),
                color=alt.Color("decision:N", title="decision"),
                tooltip=["interceptor:N", "decision:N", "mode:N", "duration_ms:Q"],
            )
        )
        st.altair_chart(chart, width="stretch")
    else:
        st.caption("The stored events carry no decision trail.")

    st.subheader("Arguments (as the event holds them, redacted)")
    args_event = next((e for e in detail.events if e["relation"] == "call" and e.get("args") is not None), None)
    if args_event is not None:
        st.json(args_event["args"], expanded=True)
        paths = args_event.get("redacted_paths") or []
        st.caption("Redacted paths (JSON pointers replaced before the event left the gate)")
        st.code("\n".join(paths) if paths else "(none)", language=None)
        if args_event.get("args_truncated"):
            st.caption("The arguments were cut to the event's size limit.")
    else:
        st.caption("No event of this call holds its arguments.")

    st.subheader("Trace")
    trace_id = head.get("trace_id")
    link = cfg.trace_link(trace_id)
    st.code(trace_id or "(no trace id)", language=None)
    if link:
        st.link_button("Open in the trace viewer", link)
    elif trace_id:
        st.caption("Not a well-formed trace id; no link is made from it.")

    st.subheader("Events")
    ui.table(
        detail.events,
        [
            "relation",
            "time",
            "type",
            "outcome",
            "decided_by",
            "tool",
            "run_id",
            "call_id",
            "seq",
        ],
        key="call_events",
    )
    evidence_section(detail)
    proof_section(detail)


def evidence_section(detail: CallDetail) -> None:
    """The stored event (as stored, redacted at the gate) and the call's events as a download."""
    st.subheader("Stored event")
    stored = [e for e in detail.events if e.get("stored_event")]
    if not stored:
        st.caption("The store returned no stored form of this call's events.")
        return
    labels = {str(e["event_id"]): f"{e['relation']}: {e['type']} (seq {e.get('seq')}): {e['event_id']}" for e in stored}
    outcome = detail.outcome
    ids = list(labels)
    chosen = ids.index(str(outcome["event_id"])) if outcome is not None and str(outcome["event_id"]) in ids else 0
    event_id = st.selectbox(
        "Event", ids, index=chosen, format_func=lambda i: labels.get(i, i), key=f"stored_pick_{detail.call_id}"
    )
    text = next(str(e["stored_event"]) for e in stored if str(e["event_id"]) == event_id)
    try:
        shown = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        shown = text
    st.caption("As the store holds it (arguments redacted before the event left the gate)")
    st.code(shown, language="json", wrap_lines=True)
    safe_name = re.sub(r"[^A-Za-z0-9._-]", "_", detail.call_id)[:100]
    st.download_button(
        "Download evidence (events as JSON lines)",
        call_evidence(detail),
        file_name=f"call-{safe_name}.jsonl",
        mime="application/x-ndjson",
        on_click="ignore",
        key="call_evidence",
        help="Every stored event of this call and of the calls it made, one per line, as stored.",
    )
    if ui.access().all_tenants:
        # Built when downloaded, off this run: it reads as the session that drew the button.
        read_as_this_session = ui.query_as(ui.access())
        st.download_button(
            "Download inclusion proofs (JSON lines)",
            data=lambda: call_proofs(read_as_this_session, detail),
            file_name=f"call-{safe_name}-proofs.jsonl",
            mime="application/x-ndjson",
            on_click="ignore",
            key="call_proofs",
            help="For each of the call's own events, its inclusion proof where the producer signs (one per line; "
            "a line saved as a file is checked by `callgate verify --proof`), else why there is none.",
        )


def _ask_proof(event_id: str) -> None:
    st.session_state["proof_event"] = event_id


def proof_section(detail: CallDetail) -> None:
    """Pick one of the call's own events (its outcome by default); "Proof" shows its inclusion proof."""
    st.subheader("Proof")
    if not ui.access().all_tenants:
        st.caption("A proof reads its producer's whole chain, every tenant's: it needs the admin or auditor role.")
        return
    own = [e for e in detail.events if e["relation"] == "call" and e.get("event_id")]
    if not own:
        st.caption("No event of this call itself is stored.")
        return
    st.caption(
        "An inclusion proof shows that the event is in its producer's hash tree whose root a signed checkpoint "
        "states; the proof file can be checked offline by anyone with the gate's public key."
    )
    labels = {str(e["event_id"]): f"{e['type']} (seq {e.get('seq')}): {e['event_id']}" for e in own}
    ids = list(labels)
    outcome = detail.outcome
    chosen = ids.index(str(outcome["event_id"])) if outcome is not None and str(outcome["event_id"]) in ids else 0
    event_id = st.selectbox(
        "Event to prove", ids, index=chosen, format_func=lambda i: labels.get(i, i), key=f"proof_pick_{detail.call_id}"
    )
    st.button("Proof", key="proof_button", on_click=_ask_proof, args=(event_id,), type="primary")
    if event_id is not None and st.session_state.get("proof_event") == event_id:
        show_proof(event_id)


def show_proof(event_id: str) -> None:
    try:
        view = ui.proof(event_id)
    except QueryError as exc:
        # A read API older than proofs does not know the query.
        st.warning("This store cannot build proofs: it predates signed checkpoints.")
        st.text(str(exc))
        return
    if view.proof is None:
        st.info("This event has no inclusion proof: the reason follows.")
        st.text(view.verdict.line())
        return
    if not view.verdict.ok:
        st.error("The proof does not verify.")
    elif view.signature_checked:
        st.success("The proof verifies: the event is in the tree of a checkpoint signed by a trusted key.")
    else:
        st.warning(
            "The inclusion verifies, but the signature was not checked: the dashboard has no trusted keys "
            "(start it with `--trusted-keys`). Check the downloaded proof offline with the gate's public key:"
        )
    st.text(view.verdict.line())
    ui.table(view.steps, ["step", "result", "detail", "checks"], key="proof_steps")
    st.caption("Check it offline (no store, no network):")
    st.code(view.offline_command, language=None)
    st.download_button(
        "Download proof",
        view.text,
        file_name=view.file_name,
        mime="application/json",
        on_click="ignore",
        key="proof_download",
    )
    st.caption("The proof document")
    st.code(view.text, language="json")


if call_id:
    with ui.problems():
        if ui.ready():
            show(call_id)
