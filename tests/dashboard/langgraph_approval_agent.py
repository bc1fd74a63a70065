"""A LangGraph agent process for the approvals browser test: `create_agent` with a scripted chat
model, a SQLite checkpointer and `CallgateMiddleware` whose desk is the read API's reviewers' desk
(`RemoteApprovals(ApiDecisions(...), trusted_keys=...)`); one refund call that a policy puts to a
reviewer, its events on the events topic.

python langgraph_approval_agent.py pause|resume BOOTSTRAP EVENTS_TOPIC SPOOL_DIR WORKDIR RAN_FILE
    CALL_ID API TOKEN DESK_KEYS

pause: runs until LangGraph pauses the call, prints `{"paused": APPROVAL_ID}` once its request is on
the events topic, and waits (to be killed). resume: waits for a line on stdin (so a test can start
it before the decision, and its imports need not wait), then resumes the saved thread with
`Command(resume={"approval_id": APPROVAL_ID})`, the line's text, and prints the call's reply as one
JSON line. Each run of the tool body appends a line to RAN_FILE.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from approval_agent import POLICY  # the plain agent's policy (this folder is on the path)
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.types import Command

from events.decisions import ApiDecisions
from events.kafka import KafkaSink
from interceptor_core import Gate, RunContext
from interceptor_core.approvals import RemoteApprovals
from interceptor_core.integrations.langchain import CallgateMiddleware
from interceptor_core.policy import Policy


class ScriptedChat(GenericFakeChatModel):
    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedChat:  # type: ignore[override]
        return self


async def main(argv: list[str]) -> None:
    phase, bootstrap, topic, spool, workdir, ran_file, call_id, api, token, desk_keys = argv

    @tool
    def refund(order_id: str, amount_cents: int) -> str:
        """Refunds an order."""
        with Path(ran_file).open("a") as ran:
            ran.write(f"{call_id} {amount_cents}\n")
        return f"refunded {amount_cents}"

    turns = [AIMessage("done")]
    if phase == "pause":
        args = {"order_id": "ACME-2", "amount_cents": 25000}
        turns.insert(0, AIMessage("", tool_calls=[{"id": call_id, "name": "refund", "args": args}]))
    resumed_with = sys.stdin.readline().strip() if phase == "resume" else ""
    sink = KafkaSink(bootstrap, topic, spool, linger_ms=1)
    gate = Gate("shop", interceptors=[Policy.from_text(POLICY)], sinks=[sink])
    run = RunContext(tenant="acme", principal="u-1", run_id=f"run-{call_id}")
    thread: Any = {"configurable": {"thread_id": call_id}}
    async with ApiDecisions(api, token=token) as decisions:
        desk = RemoteApprovals(decisions, trusted_keys=desk_keys)
        middleware = [CallgateMiddleware([refund], gate=gate, agent="refunds", run=run, desk=desk)]
        async with AsyncSqliteSaver.from_conn_string(str(Path(workdir) / "checkpoints.sqlite")) as saver:
            model = ScriptedChat(messages=iter(turns))
            graph = create_agent(model, tools=[refund], middleware=middleware, checkpointer=saver)
            if phase == "pause":
                out = await graph.ainvoke({"messages": [HumanMessage("refund ACME-2")]}, thread)
                (pause,) = out["__interrupt__"]
                await sink.flush(timeout=10)  # the request is on its way to the store
                print(json.dumps({"paused": pause.value["approval_id"]}), flush=True)
                await asyncio.Event().wait()
            out = await graph.ainvoke(Command(resume={"approval_id": resumed_with}), thread)
    await sink.close(timeout=30)
    (reply,) = [m for m in out["messages"] if isinstance(m, ToolMessage) and m.tool_call_id == call_id]
    print(json.dumps({"status": reply.status, "content": reply.content}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
