"""An agent process for the claims test: one refund call through a gate whose policy asks a
reviewer; it learns the decision from the read API (`api`) or the decisions topic (`kafka`), and
claims the approval from the read API before the call runs; prints the result as one JSON line.

python approval_racer.py BOOTSTRAP EVENTS_TOPIC DECISIONS_TOPIC API TOKEN TRUSTED_KEYS SPOOL_DIR
    RAN_FILE CALL_ID MODE

Each run of the tool body appends a line to RAN_FILE (so a test counts the runs across processes).
Prints `{"waiting": true, ...}` once the request is asked.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from pydantic import BaseModel

from events.decisions import ApiDecisions, KafkaDecisions
from events.kafka import KafkaSink
from interceptor_core import ApprovalRequest, Gate, RunContext, tool
from interceptor_core.approvals import RemoteApprovals
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
    bootstrap, topic, decisions_topic, api, token, trusted, spool, ran_file, call_id, mode = argv

    @tool
    def refund(args: Refund) -> str:
        with Path(ran_file).open("a") as ran:
            ran.write(f"{call_id} {args.amount_cents}\n")
        return "refunded"

    sink = KafkaSink(bootstrap, topic, spool, linger_ms=1)
    claims = ApiDecisions(api, token=token, interval_s=0.1)
    decisions = claims if mode == "api" else KafkaDecisions(bootstrap, decisions_topic)
    await decisions.start()
    remote = RemoteApprovals(decisions, trusted_keys=trusted, claims=claims)

    async def handler(request: ApprovalRequest) -> object:
        await sink.flush(timeout=10)  # the request is in the store's topic before anyone waits for it
        print(json.dumps({"waiting": True, "approval_id": request.approval_id}), flush=True)
        return await remote(request)

    gate = Gate(
        "shop",
        interceptors=[Policy.from_text(POLICY)],
        sinks=[sink],
        approval_handler=handler,
        approval_timeout_s=60,
    )
    run = RunContext(tenant="acme", principal="u-1", run_id=f"run-{call_id}")
    try:
        result = await gate.agent("desk", tools=[refund]).call(
            "refund", {"order_id": "ACME-1", "amount_cents": 20000}, run=run, call_id=call_id
        )
    finally:
        await decisions.close()
    await sink.close(timeout=30)
    print(json.dumps({"kind": result.kind, "message": result.message}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
