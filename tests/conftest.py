"""Shared pieces for the whole suite."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from callgate.broker import EmbeddedBroker


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[EmbeddedBroker]:
    """One embedded broker on a free loopback port for the whole session; tests must not stop or kill it
    (use `fresh_broker` for that) and should use their own topic names. It dies with the test process,
    however that ends."""
    with EmbeddedBroker(die_with_parent=True) as broker:
        yield broker


@pytest.fixture
def fresh_broker() -> Iterator[EmbeddedBroker]:
    """A broker of the test's own on a free loopback port, free to kill and restart; stopped afterwards
    (and killed with the test process, however that ends)."""
    with EmbeddedBroker(die_with_parent=True) as broker:
        yield broker


@pytest.fixture
def topic() -> str:
    """A topic name of the test's own, so tests sharing the session's broker never meet."""
    return f"events-{uuid.uuid4().hex[:8]}"
