"""Whether a chain would ask a human about a call, found without recording anything.

For the framework approval flows that must know before a call whether it pauses (LangGraph's
`interrupt()` on a resumed run): the before-interceptors run on the arguments, rewrites applied,
and nothing is emitted. The call itself then passes the whole chain as usual.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from interceptor_core.approvals import approval_id_for, args_digest
from interceptor_core.context import RunContext, ToolCall
from interceptor_core.decisions import Allow, PolicyDecision, RequireApproval, Rewrite
from interceptor_core.gate import AgentScope

__all__ = ["AskedApproval", "approval_asked"]


@dataclass(frozen=True, slots=True)
class AskedApproval:
    """What the chain asks a human about: the arguments as the tool would get them (after
    rewrites), the reasons joined as the gate joins them, and the interceptors that asked."""

    args: Mapping[str, Any]
    reason: str
    requested_by: tuple[str, ...]
    approval_id: str = ""
    """The id the gate gives the call's request (`approval_id_for`; empty without a call id)."""


async def approval_asked(
    scope: AgentScope, name: str, args: Mapping[str, Any], run: RunContext, call_id: str | None
) -> AskedApproval | None:
    """What the chain of `scope` would ask approval for on this call, or None when it would not
    ask (it allows the call, or ends it another way: a denial, a substitute, a block, a failing
    interceptor, arguments that do not validate; the call then ends that way when it is made).
    Shadow interceptors are not asked. Never raises for what an interceptor does; never records.
    A rate limit counts a call id once, so asking here and again in the call counts it once."""
    if name not in scope.tools:
        return None
    compiled = scope._chain(name)
    model = compiled.tool.input_model
    try:
        call = ToolCall(compiled.tool, model.model_validate(args), run, call_id or "", compiled.path)
    except ValidationError:
        return None
    asked: list[tuple[str, str]] = []
    versions: list[str] = []  # of the policies that ask, as the gate binds the request to them
    timeout = scope.gate.interceptor_timeout_s
    for bound in compiled.before:
        if bound.shadow or bound.before is None:
            continue
        try:
            decision = bound.before(call)
            if inspect.isawaitable(decision):
                async with asyncio.timeout(timeout):
                    decision = await decision
            if type(decision) is PolicyDecision:
                if decision.args is not None:
                    given = decision.args
                    call._replace_args(given if isinstance(given, model) else model.model_validate(given))
                if type(decision.decision) is RequireApproval:
                    versions.append(decision.policy_version)
                decision = decision.decision
            if type(decision) is Rewrite:
                new = decision.args
                call._replace_args(new if isinstance(new, model) else model.model_validate(new))
        except Exception:
            return None
        if type(decision) is RequireApproval:
            asked.append((bound.name, decision.reason))
        elif decision is not None and type(decision) not in (Allow, Rewrite):
            return None
    if not asked:
        return None
    approval_id = ""
    if call_id:
        digest = args_digest(call.args_model.model_dump(mode="json"))
        approval_id = approval_id_for(call_id, digest, ",".join(dict.fromkeys(versions)) or None)
    return AskedApproval(dict(call.args), "; ".join(r for _, r in asked), tuple(n for n, _ in asked), approval_id)
