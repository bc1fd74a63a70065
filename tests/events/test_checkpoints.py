"""Signed checkpoints from a real gate: when they come, what they cover, and that they verify."""

from __future__ import annotations

import asyncio
import base64
import time
from pathlib import Path
from typing import Any

import pytest

from events import CheckpointEvent, MemorySink, verify_chain
from events.checkpoints import ORIGIN_PREFIX
from events.merkle import root_of
from events.signing import SigningKey, open_signed_note
from interceptor_core import ConfigurationError, Gate, RunContext, tool

RUN = RunContext(tenant="acme")


@tool
async def ping(n: int) -> int:
    return n


def signed_gate(sink: MemorySink, key: SigningKey, **options: Any) -> Any:
    gate = Gate("shop", sinks=[sink], signing_key=key, **options)
    return gate, gate.agent("desk", tools=[ping])


def checkpoints(sink: MemorySink) -> list[CheckpointEvent]:
    return [e for e in sink.events if isinstance(e, CheckpointEvent)]


def assert_verifies(checkpoint: CheckpointEvent, sink: MemorySink, key: SigningKey) -> None:
    """The checkpoint's root is the tree over the hashes of events 1..tree_size of its producer,
    and its note is signed by the key and says the same."""
    chain = sorted((e for e in sink.events if e.producer_id == checkpoint.producer_id), key=lambda e: e.seq)
    covered = [bytes.fromhex(e.hash) for e in chain[: checkpoint.tree_size]]
    assert [e.seq for e in chain[: checkpoint.tree_size]] == list(range(1, checkpoint.tree_size + 1))
    assert checkpoint.root == root_of(covered).hex()
    body, signers = open_signed_note(checkpoint.note.encode(), {key.key_id: key.public()})
    assert signers == [key.key_id]
    lines = body.decode().splitlines()
    assert lines[:3] == [
        ORIGIN_PREFIX + checkpoint.producer_id,
        str(checkpoint.tree_size),
        base64.b64encode(bytes.fromhex(checkpoint.root)).decode(),
    ]
    assert ("callgate-closing" in lines) is checkpoint.closing
    assert checkpoint.key_id == key.key_id


async def until(predicate: Any, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "not within the deadline"
        await asyncio.sleep(0.005)  # sleep-ok: polling with a deadline for the checkpointer's thread


class TestCadence:
    async def test_every_n_events_and_a_closing_one(self) -> None:
        """With checkpoint_events=5, a checkpoint follows every fifth event; close adds a closing
        one covering everything before it; each verifies against the chain."""
        sink, key = MemorySink(), SigningKey.generate("shop")
        gate, desk = signed_gate(sink, key, checkpoint_events=5, checkpoint_s=60, heartbeat_s=60)
        for n in range(4):  # with ToolsRegistered, five events
            await desk.call("ping", {"n": n}, run=RUN)
        await until(lambda: len(checkpoints(sink)) == 1)
        assert checkpoints(sink)[0].tree_size == 5
        for n in range(4):  # five more (the checkpoint itself does not count)
            await desk.call("ping", {"n": n}, run=RUN)
        await desk.call("ping", {"n": 9}, run=RUN)  # the fifth
        await until(lambda: len(checkpoints(sink)) == 2)
        assert checkpoints(sink)[1].tree_size >= 10
        await gate.close()
        found = checkpoints(sink)
        assert found[-1].closing
        assert not any(c.closing for c in found[:-1])
        assert found[-1].tree_size == found[-1].seq - 1  # it covers every event before it
        for checkpoint in found:
            assert_verifies(checkpoint, sink, key)
        assert verify_chain(sink.events).ok

    async def test_checkpoint_s_after_the_first_uncovered_event(self) -> None:
        """One call and then nothing: a checkpoint comes checkpoint_s later, not at the count."""
        sink, key = MemorySink(), SigningKey.generate("shop")
        # The clock starts at the first uncovered event: the scope's ToolsRegistered, before the call.
        started = time.monotonic()
        gate, desk = signed_gate(sink, key, checkpoint_events=1000, checkpoint_s=0.2, heartbeat_s=60)
        await desk.call("ping", {"n": 1}, run=RUN)
        await until(lambda: len(checkpoints(sink)) == 1)
        assert time.monotonic() - started >= 0.2
        (checkpoint,) = checkpoints(sink)
        assert (checkpoint.time - sink.events[0].time).total_seconds() >= 0.2 - 0.01  # clocks apart by rounding
        assert checkpoint.tree_size == checkpoint.seq - 1
        assert_verifies(checkpoint, sink, key)
        await gate.close()

    async def test_a_heartbeat_while_idle_and_no_checkpoint_storm(self) -> None:
        """Idle, the gate still checkpoints every heartbeat_s (same tree size but its own
        checkpoints); a checkpoint alone never triggers the next one at checkpoint_s."""
        sink, key = MemorySink(), SigningKey.generate("shop")
        gate, desk = signed_gate(sink, key, checkpoint_events=1000, checkpoint_s=0.05, heartbeat_s=0.5)
        await desk.call("ping", {"n": 1}, run=RUN)
        await until(lambda: len(checkpoints(sink)) == 1)
        first = time.monotonic()
        await until(lambda: len(checkpoints(sink)) == 2, 5)
        assert time.monotonic() - first >= 0.4  # the heartbeat, not checkpoint_s
        await gate.close()
        heartbeat = checkpoints(sink)[1]
        assert heartbeat.heartbeat_s == 0.5
        assert_verifies(heartbeat, sink, key)


class TestConfiguration:
    def test_a_key_file_path_is_accepted(self, tmp_path: Path) -> None:
        private, _ = SigningKey.generate("shop").write(tmp_path)
        gate = Gate("shop", sinks=[MemorySink()], signing_key=private)
        assert gate._audit is not None
        assert gate._audit.checkpointer is not None

    def test_a_bad_key_path_names_it(self, tmp_path: Path) -> None:
        with pytest.raises(ConfigurationError, match="signing_key"):
            Gate("shop", sinks=[MemorySink()], signing_key=tmp_path / "missing.key")

    def test_without_a_key_no_checkpoints(self) -> None:
        sink = MemorySink()
        gate = Gate("shop", sinks=[sink])
        desk = gate.agent("desk", tools=[ping])
        asyncio.run(desk.call("ping", {"n": 1}, run=RUN))
        asyncio.run(gate.close())
        assert checkpoints(sink) == []

    @pytest.mark.parametrize(
        "options",
        [{"checkpoint_events": 0}, {"checkpoint_s": 0}, {"heartbeat_s": -1}],
        ids=["events", "s", "heartbeat"],
    )
    def test_bad_cadence_is_refused(self, options: dict[str, Any]) -> None:
        with pytest.raises(ConfigurationError, match="checkpoint_events"):
            Gate("shop", sinks=[MemorySink()], signing_key=SigningKey.generate(), **options)
