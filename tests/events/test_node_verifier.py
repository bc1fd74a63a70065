"""A chain written by a real gate verifies with a program not written in Python (docs/verify_chain.mjs
under Node.js), and that program catches what an auditor must be told about."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from events import JsonlSink, read_jsonl, verify_chain
from interceptor_core import Deny, Gate, RunContext, ToolCall, tool

VERIFIER = Path(__file__).resolve().parents[2] / "docs" / "verify_chain.mjs"
NODE = shutil.which("node")


class Note(BaseModel):
    to: str
    body: str
    amount: float = 0.0


def _send(args: Note) -> str:
    return f"sent to {args.to}"


send = tool(name="send_note", description="Sends a note", inline=True)(_send)


class NoRefunds:
    name = "no-refunds"

    def before_tool_call(self, call: ToolCall) -> Deny | None:
        return Deny("refund notes need a human") if "refund" in call.args_model.body else None  # type: ignore[attr-defined]


async def write_chain(path: Path) -> list[bytes]:
    """A real gate's events for allowed and denied calls with non-ASCII text, a card number that
    gets redacted, floats and a shadow-free trail; returns the file's lines."""
    gate = Gate("billing desk ü", interceptors=[NoRefunds()], sinks=[JsonlSink(path)])
    desk = gate.agent("desk", tools=[send])
    run = RunContext(tenant="acme", principal="ann@acme.example")
    for i, body in enumerate(["héllo ✓ 中文", "card 4111 1111 1111 1111", "please refund", "1e-7 ≈ tiny"]):
        await desk.call("send_note", {"to": f"c{i}@x.example", "body": body, "amount": i / 3}, run=run)
    await desk.call("no_such_tool", {"x": 1}, run=run)
    await gate.close()
    return [line for line in path.read_bytes().split(b"\n") if line]  # noqa: ASYNC240 - a small local file


def node_verify(*paths: Path) -> tuple[int, dict[str, Any]]:
    assert NODE is not None, "Node.js is missing: `make venv` installs Debian's nodejs"
    done = subprocess.run([NODE, str(VERIFIER), *map(str, paths)], capture_output=True, timeout=60, check=False)
    assert done.returncode != 2, done.stderr.decode()
    return done.returncode, json.loads(done.stdout)


def rehashed(line: bytes) -> bytes:
    body = line[:-75] + b"}"
    return body[:-1] + b',"hash":"' + hashlib.sha256(body).hexdigest().encode() + b'"}'


class TestNodeVerifier:
    async def test_a_real_gates_file_verifies(self, tmp_path: Path) -> None:
        """Every event of the gate's JSONL file verifies in Node, and Python's verify_chain agrees."""
        path = tmp_path / "events.jsonl"
        lines = await write_chain(path)
        code, report = node_verify(path)
        assert (code, report["ok"], report["events"], report["unverified"]) == (0, True, len(lines), 0)
        events = read_jsonl(path)
        assert report["producers"] == {events[0].producer_id: len(lines)}
        assert verify_chain(events).ok
        assert {e.type for e in events} >= {"ToolsRegistered", "ToolUse", "ToolDenied"}

    async def test_a_changed_byte_a_missing_line_and_a_forgery_are_caught(self, tmp_path: Path) -> None:
        """A changed character, a deleted event and a re-hashed forgery each fail the Node check
        with the reason Python's verify_chain gives."""
        lines = await write_chain(tmp_path / "events.jsonl")
        target = next(i for i, line in enumerate(lines) if "héllo".encode() in line)
        line, before, after = lines[target], lines[:target], lines[target + 1 :]
        cases = {
            "changed": [*before, line.replace("héllo".encode(), b"hallo"), *after],
            "missing": [*before, *after],
            "forged": [*before, rehashed(line.replace("héllo".encode(), b"hullo")), *after],
        }
        for name, changed in cases.items():
            path = tmp_path / f"{name}.jsonl"
            path.write_bytes(b"\n".join(changed) + b"\n")
            code, report = node_verify(path)
            python = verify_chain(changed)
            assert (code, report["ok"], python.ok) == (1, False, False), name
            node_found = sorted((t["seq"], t["reason"]) for t in report["tampered"])
            assert node_found == sorted((t.seq, t.reason) for t in python.tampered), name
            assert list(report["gaps"].values()) == list(python.gaps.values()), name
        _, forged = node_verify(tmp_path / "forged.jsonl")
        # The forgery carries a valid hash of its own: only the next event's link gives it away.
        assert [t["reason"] for t in forged["tampered"]] == ["prev_hash does not link to the previous event"]
