"""Shared by the integration tests: a files root the real MCP server acts on, and its command."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

import pytest

HERE = Path(__file__).parent
UPSTREAM = HERE / "mcp_upstream.py"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A directory holding precious.txt, which no test may lose."""
    files = tmp_path / "files"
    files.mkdir()
    (files / "precious.txt").write_text("keep me")
    (files / "old.txt").write_text("old")
    return files


@pytest.fixture
def errlog(tmp_path: Path) -> Iterator[TextIO]:
    """Where the child processes' stderr goes (readable after a failure)."""
    with (tmp_path / "stderr.log").open("w") as log:
        yield log


def upstream_command() -> list[str]:
    return [sys.executable, str(UPSTREAM)]


def effects(root: Path) -> list[str]:
    """What the MCP server did, in order (empty when it did nothing)."""
    log = root / "effects.log"
    return log.read_text().splitlines() if log.exists() else []
