"""Approvals: the requests waiting for a reviewer, newest first, each with what it asks (tool, redacted
arguments, reason, rule, policy version, who and in which run), approved or denied here with a note;
and any request looked up by its approval id: its status, who decided it, and whether its approved
call was used (claimed: when, by which gate and token subject).

Deciding goes through the read API's write route with this session's token (`--api` with a login):
the decision names the logged-in subject, needs the `reviewer` role, and the API refuses one's own
requests and, for a tenant reviewer, another tenant's. Reading a store file (`--db`) lists the
requests but decides none: decisions travel through the materializer's API to the waiting gates.
"""

from __future__ import annotations

import json
from typing import Any

import streamlit as st

from consumers.approvals import post_decision
from dashboard import ui

st.title("Approvals")

# approval id -> (what this session decided, the request as shown): the request stays on the page
# with its decision after it leaves the pending list, which can happen before the page reruns.
DECIDED_KEY = "approvals_decided"

cfg = ui.config()
session = ui.access()
decided: dict[str, tuple[str, dict[str, Any]]] = st.session_state.setdefault(DECIDED_KEY, {})


def decide(request: dict[str, Any], approved: bool) -> None:
    approval_id = str(request["approval_id"])
    # The note as typed when the button was clicked (an argument bound at drawing time would be older).
    note = str(st.session_state.get(f"note-{approval_id}") or "").strip()
    if cfg.api is None:
        st.error("Decisions need the read API: start the console with --api (and a login), not --db.")
        return
    try:
        status, body = post_decision(cfg.api, approval_id, approved=approved, note=note or None, token=session.token)
    except (OSError, ValueError) as exc:
        st.error("The read API cannot be reached; nothing was decided.")
        st.text(str(exc))
        return
    if status == 200:
        told = f"{'approved' if approved else 'denied'} by {body.get('by')}"
        decided[approval_id] = (told, request)
        st.toast(f"Request {approval_id[:12]}… {told}")
    else:
        st.session_state[f"refused-{approval_id}"] = f"Refused ({status}): {body.get('error', body)}"


def show(request: dict[str, Any]) -> None:
    approval_id = str(request["approval_id"])
    with st.container(border=True, key=f"request-{approval_id}"):
        head = st.columns([3, 2, 2, 2])
        head[0].markdown(f"**{request.get('tool')}** · tenant `{request.get('tenant')}`")
        head[1].caption("Requested")
        head[1].text(str(ui.local_time(request.get("requested_at"))))
        head[2].caption("Expires")
        head[2].text(str(ui.local_time(request.get("expires_at"))))
        head[3].caption("Asked by (principal)")
        head[3].text(str(request.get("principal")))
        st.markdown(f"**Reason:** {request.get('reason')}")
        facts = st.columns(3)
        facts[0].caption("Rule")
        facts[0].text(str(request.get("rule") or request.get("requested_by") or "-"))
        facts[1].caption("Policy version")
        facts[1].text(str(request.get("policy_version") or "-")[:16])
        facts[2].caption("Approval id")
        facts[2].text(approval_id)
        st.caption("Arguments (redacted)")
        st.code(json.dumps(request.get("args"), indent=2, ensure_ascii=False, default=str), language="json")
        links = st.columns([1, 1, 4])
        run_id = request.get("run_id")
        if links[0].button("Open its run", key=f"run-{approval_id}", disabled=not run_id):
            st.session_state["open_run_id"] = run_id
            st.switch_page("views/run.py")
        if links[1].button("Open the call", key=f"call-{approval_id}", disabled=not request.get("call_id")):
            st.session_state["open_call_id"] = request.get("call_id")
            st.switch_page("views/call.py")
        refused = st.session_state.get(f"refused-{approval_id}")
        if refused:
            st.error(refused)
        if approval_id in decided:
            st.success(decided[approval_id][0])
            return
        st.text_input("Note", key=f"note-{approval_id}", placeholder="why (the model reads it on a denial)")
        buttons = st.columns([1, 1, 4])
        buttons[0].button(
            "Approve", key=f"approve-{approval_id}", type="primary", on_click=decide, args=(request, True)
        )
        buttons[1].button("Deny", key=f"deny-{approval_id}", on_click=decide, args=(request, False))


def claim_text(request: dict[str, Any]) -> str:
    """Whether the approved call of `request` was used, and by whom."""
    if request.get("status") != "approved":
        return "Not usable: the request is not approved."
    if not request.get("claimed_at"):
        return "Not used yet: no gate has claimed this approval."
    when = ui.local_time(request.get("claimed_at"))
    return f"Used: claimed by {request.get('claimed_by') or '-'} (gate {request.get('claimant') or '-'}) at {when}"


def look_up() -> None:
    """A request by its approval id, whatever its status: the decision and the claim."""
    st.subheader("Look up a request")
    approval_id = st.text_input("Approval id", key="lookup-approval-id", placeholder="32 hex digits").strip()
    if not approval_id:
        return
    rows = ui.query("approval_request", {"approval_id": approval_id, "tenant": ui.filters_tenant(), "limit": 1})
    if not rows:
        st.warning(f"No approval request {approval_id!r} (or not one this login may read).")
        return
    request = rows[0]
    with st.container(border=True, key=f"lookup-{approval_id}"):
        head = f"**{request.get('tool')}** · tenant `{request.get('tenant')}`"
        st.markdown(f"{head} · status **{request.get('status')}**")
        facts = st.columns(3)
        facts[0].caption("Decided by")
        facts[0].text(str(request.get("decided_by") or "-"))
        facts[1].caption("Decided at")
        facts[1].text(str(ui.local_time(request.get("resolved_at")) or "-"))
        facts[2].caption("Note")
        facts[2].text(str(request.get("note") or "-"))
        st.markdown(claim_text(request))


with ui.problems():
    if cfg.api is None:
        st.info("Reading a store file: requests are listed, but deciding needs the console on the read API (--api).")
    rows = ui.query("pending_approvals", {"tenant": ui.filters_tenant(), "limit": 200})
    waiting = [row for row in rows if row["approval_id"] not in decided]
    st.caption("1 request waiting." if len(waiting) == 1 else f"{len(waiting)} requests waiting, newest first.")
    if not waiting:
        st.info("No request is waiting for a reviewer.")
    for row in waiting:
        show(row)
    if decided:
        st.subheader("Decided here")
        for _, request in reversed(list(decided.values())[-20:]):
            show(request)
    look_up()
