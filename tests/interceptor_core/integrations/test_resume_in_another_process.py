"""A call paused for approval through its framework's own mechanism survives its process: the agent
process pauses, saves the framework's state and is killed (SIGKILL); a new process resumes from that
state with the decision, under the same call id. Real processes (`paused_agent.py`), each writing
its events to a JSONL file of its own.

Slow (about 30 s in all on a loaded machine): each of the six processes imports its framework, so
each process pauses two calls where its framework allows (one approved, one rejected)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from events import EventBase, parse_event, verify_chain

AGENT = Path(__file__).with_name("paused_agent.py")
REPO = Path(__file__).resolve().parents[3]
OUTCOMES = {"ToolUse", "ToolDenied", "Substitute", "Blocked"}


def agent_command(framework: str, phase: str, workdir: Path, *rest: str) -> list[str]:
    return [sys.executable, str(AGENT), framework, phase, str(workdir), *rest]


def read_events(path: Path) -> list[EventBase]:
    return [parse_event(line) for line in path.read_text().splitlines() if line]


WHO_DECIDED = {
    # (who approved c1, who rejected c2) as the events name them: the OpenAI Agents SDK does not say
    # who approved (`RunState.approve`); `reject(...)` does. Pydantic AI says it for an approval
    # (`DeferredToolResults.metadata`), not for a `ToolDenied`. LangGraph's resume value says it.
    "openai-agents": ("ToolUse", None, "alice"),
    "pydantic-ai": ("ToolUse", "alice", None),
    "langgraph": ("ToolUse", "alice", None),
}


@pytest.mark.parametrize("framework", ["openai-agents", "pydantic-ai", "langgraph"])
def test_killed_while_paused_then_resumed_in_a_new_process(tmp_path: Path, framework: str) -> None:
    """The paused process recorded each paused call's durable request and no outcome; killed, it
    leaves the files untouched; the new process decides from the saved state, and each call leaves,
    under its call id and one approval id, the request asked again, one `ApprovalResolved` and one
    outcome: the approved delete ran once, the rejected one never (LangGraph pauses one call at a
    time: one call, approved)."""
    files = tmp_path / "files"
    files.mkdir()
    (files / "old.txt").write_text("old")
    (files / "other.txt").write_text("other")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    pausing = subprocess.Popen(
        agent_command(framework, "pause", tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = pausing.stdout.readline() if pausing.stdout else ""
        assert line.strip() == "paused", pausing.stderr.read() if pausing.stderr else ""
        os.kill(pausing.pid, signal.SIGKILL)
        assert pausing.wait(timeout=30) == -signal.SIGKILL
    finally:
        if pausing.poll() is None:
            pausing.kill()
            pausing.wait()
        for stream in (pausing.stdout, pausing.stderr):
            if stream is not None:
                stream.close()
    paused_calls = ["c1"] if framework == "langgraph" else ["c1", "c2"]
    assert sorted(p.name for p in files.iterdir()) == ["old.txt", "other.txt"]
    at_pause = read_events(tmp_path / "events-pause.jsonl")
    assert sorted((e.type, e.call_id) for e in at_pause if e.type != "ToolsRegistered") == [
        ("ApprovalRequested", call_id) for call_id in paused_calls
    ]

    resumed = subprocess.run(
        agent_command(framework, "resume", tmp_path), capture_output=True, text=True, env=env, timeout=120
    )
    assert resumed.returncode == 0, resumed.stderr
    events = at_pause + read_events(tmp_path / "events-resume.jsonl")
    _, approver, rejecter = WHO_DECIDED[framework]
    expected = {"c1": ("ToolUse", True, approver), "c2": ("ToolDenied", False, rejecter)}
    for call_id in paused_calls:
        outcome, approved, by = expected[call_id]
        trail = [e for e in events if e.call_id == call_id]
        assert [e.type for e in trail] == ["ApprovalRequested", "ApprovalRequested", "ApprovalResolved", outcome]
        (resolved,) = [e for e in trail if e.type == "ApprovalResolved"]
        assert {e.approval_id for e in trail if e.type == "ApprovalRequested"} == {resolved.approval_id}
        assert (resolved.approved, resolved.by) == (approved, by)
        assert {(e.tenant, e.run_id) for e in trail} == {("acme", "run-1")}
    assert sorted(e.call_id or "" for e in events if e.type in OUTCOMES) == paused_calls
    assert not (files / "old.txt").exists()
    assert (files / "other.txt").exists()
    assert "deleted old.txt" in resumed.stdout
    assert verify_chain(events).ok
