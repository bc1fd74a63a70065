"""A call paused for approval through its framework's own mechanism survives its process: the agent
process pauses, saves the framework's state and is killed (SIGKILL); a new process resumes from that
state with the decision, under the same call id (for OpenAI Agents, a reviewer's process decides on
the saved state first, and the new process resumes from the decided state). Real processes
(`paused_agent.py`), each writing its events to a JSONL file of its own.

Slow (about 30 s in all on a loaded machine): each of the seven processes imports its framework, so
each process pauses all the calls where its framework allows (approved, rejected)."""

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


DECISIONS = {
    # call id -> (outcome, approved, who decided as the events name them), per framework.
    # OpenAI Agents: `approve(...)` and `reject(...)` name the reviewer; the SDK's own `state.reject`
    # (c3) names nobody. Pydantic AI names who approved (`DeferredToolResults.metadata`), not who
    # rejected: its `ToolDenied` carries a message only, and the metadata of a denied call reaches
    # no toolset. LangGraph pauses one call at a time: one call, approved, its resume value naming who.
    "openai-agents": {
        "c1": ("ToolUse", True, "alice"),
        "c2": ("ToolDenied", False, "alice"),
        "c3": ("ToolDenied", False, None),
    },
    "pydantic-ai": {"c1": ("ToolUse", True, "alice"), "c2": ("ToolDenied", False, None)},
    "langgraph": {"c1": ("ToolUse", True, "alice")},
}


@pytest.mark.parametrize("framework", ["openai-agents", "pydantic-ai", "langgraph"])
def test_killed_while_paused_then_resumed_in_a_new_process(tmp_path: Path, framework: str) -> None:
    """The paused process recorded each paused call's durable request and no outcome; killed, it
    leaves the files untouched; the new process (or, for OpenAI Agents, a reviewer's process)
    decides from the saved state, and each call leaves, under its call id and one approval id, the
    request asked again, one `ApprovalResolved` naming who decided and one outcome: the approved
    delete ran once, the rejected ones never."""
    files = tmp_path / "files"
    files.mkdir()
    names = ["old.txt", "other.txt", "third.txt"]
    for name in names:
        (files / name).write_text(name)
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
    decisions = DECISIONS[framework]
    paused_calls = sorted(decisions)
    assert sorted(p.name for p in files.iterdir()) == names
    at_pause = read_events(tmp_path / "events-pause.jsonl")
    assert sorted((e.type, e.call_id) for e in at_pause if e.type != "ToolsRegistered") == [
        ("ApprovalRequested", call_id) for call_id in paused_calls
    ]

    events = at_pause
    if framework == "openai-agents":
        decided = subprocess.run(
            agent_command(framework, "decide", tmp_path), capture_output=True, text=True, env=env, timeout=120
        )
        assert decided.stdout.strip() == "decided", decided.stderr
        events = events + read_events(tmp_path / "events-decide.jsonl")
    resumed = subprocess.run(
        agent_command(framework, "resume", tmp_path), capture_output=True, text=True, env=env, timeout=120
    )
    assert resumed.returncode == 0, resumed.stderr
    at_resume = read_events(tmp_path / "events-resume.jsonl")
    events = events + at_resume
    for call_id in paused_calls:
        outcome, approved, by = decisions[call_id]
        trail = [e for e in events if e.call_id == call_id]
        assert [e.type for e in trail] == ["ApprovalRequested", "ApprovalRequested", "ApprovalResolved", outcome]
        (resolved,) = [e for e in trail if e.type == "ApprovalResolved"]
        assert {e.approval_id for e in trail if e.type == "ApprovalRequested"} == {resolved.approval_id}
        assert (resolved.approved, resolved.by) == (approved, by)
        assert {(e.tenant, e.run_id) for e in trail} == {("acme", "run-1")}
    assert sorted(e.call_id or "" for e in events if e.type in OUTCOMES) == paused_calls
    assert sorted(p.name for p in files.iterdir()) == ["other.txt", "third.txt"]
    assert "deleted old.txt" in resumed.stdout
    if framework == "openai-agents":
        # The approval's note travelled in the state string; the SDK's rejection is recorded by the
        # process that resumed, with the SDK's message (c2 was recorded by the reviewer's process).
        notes = {e.call_id: e.note for e in at_resume if e.type == "ApprovalResolved"}
        assert notes == {"c1": "looked at it", "c3": "no thanks"}
    assert verify_chain(events).ok
