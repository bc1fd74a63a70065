"""An agent process for the approvals tests: one refund call through a gate whose policy asks a
reviewer, waiting for the decision on the decisions topic; prints the result as one JSON line.

python approval_agent.py BOOTSTRAP EVENTS_TOPIC DECISIONS_TOPIC SPOOL_DIR RAN_FILE CALL_ID AMOUNT
    TIMEOUT_S TENANT PRINCIPAL [API TOKEN]

With API and TOKEN, an approved call is claimed through the read API before it runs, and a call
whose request the store holds already (asked by a process killed while it waited) is not asked again.

Each run of the tool body appends a line to RAN_FILE (so a test counts the runs across processes).
Prints `{"waiting": true}` once the request is asked.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from pydantic import BaseModel

from events.decisions import ApiDecisions, KafkaDecisions
from events.kafka import KafkaSink
from interceptor_core import Approval, ApprovalRequest, Gate, RunContext, tool
from interceptor_core.approvals import PER_PROCESS, RemoteApprovals
from interceptor_core.policy import Policy

POLICY = """\
version: 1
name: refunds
rules:
  - id: big-refunds
    tools: [refund]
    when: "args.amount_cents > 10000"
    decision: require_approval
    message: "Refunds over 100.00 need a reviewer."
"""


class Refund(BaseModel):
    order_id: str
    amount_cents: int


async def main(argv: list[str]) -> None:
    bootstrap, topic, decisions_topic, spool, ran_file, call_id, amount, timeout_s, tenant, principal = argv[:10]
    claims = ApiDecisions(argv[10], token=argv[11]) if len(argv) > 10 else PER_PROCESS

    @tool
    def refund(args: Refund) -> str:
        with Path(ran_file).open("a") as ran:
            ran.write(f"{call_id} {args.amount_cents}\n")
        return "refunded"

    sink = KafkaSink(bootstrap, topic, spool, linger_ms=1)

    class Announced(RemoteApprovals):
        """Says when it waits; its `recorded` (the read API's, with API and TOKEN) spares a resumed
        call a second request."""

        async def __call__(self, request: ApprovalRequest) -> Approval:
            await sink.flush(timeout=10)  # the request is in the store's topic before anyone waits for it
            print(json.dumps({"waiting": True, "approval_id": request.approval_id}), flush=True)
            return await super().__call__(request)

    async with KafkaDecisions(bootstrap, decisions_topic) as decisions:
        gate = Gate(
            "shop",
            interceptors=[Policy.from_text(POLICY)],
            sinks=[sink],
            approval_handler=Announced(decisions, claims=claims),
            approval_timeout_s=float(timeout_s),
        )
        desk = gate.agent("desk", tools=[refund])
        run = RunContext(tenant=tenant, principal=principal, run_id=f"run-{call_id}")
        result = await desk.call(
            "refund", {"order_id": "ACME-1", "amount_cents": int(amount)}, run=run, call_id=call_id
        )
    await sink.close(timeout=30)
    print(json.dumps({"kind": result.kind, "message": result.message}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
