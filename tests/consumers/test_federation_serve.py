"""The `callgate serve` command: it starts over real shards and answers through them; settings it
cannot use stop it with exit 2 and one line naming the culprit."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from callgate.cli import app
from consumers.api import ApiServer, HealthStatus, build_app
from consumers.auth import TokenFile, hash_token
from consumers.metrics import MaterializerMetrics
from consumers.runner import StoreQueryRunner
from consumers.store import AuditStore

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def shard(tmp_path: Path) -> Iterator[str]:
    """An empty store's read API, needing the admin token "shard-secret"."""
    tokens = tmp_path / "shard-tokens.yaml"
    tokens.write_text(f"tokens: [{{subject: serve, sha256: {hash_token('shard-secret')}, roles: [admin]}}]\n")
    store = AuditStore(tmp_path / "shard.duckdb")
    server = ApiServer(
        build_app(StoreQueryRunner(store), MaterializerMetrics(), lambda: HealthStatus(ok=True), auth=TokenFile(tokens))
    )
    server.start()
    yield server.url
    server.stop()
    store.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class TestStartupErrors:
    """What serve refuses before it listens: exit 2, one line on stderr naming the option."""

    @pytest.mark.parametrize(
        ("args", "culprit"),
        [
            ([], "--shard"),
            (["--shard", "ftp://x:1"], "--shard"),
            (["--shard", "http://127.0.0.1:1", "--api", "0.0.0.0:8765"], "--api 0.0.0.0:8765"),
            (["--shard", "http://127.0.0.1:1", "--api", "nowhere"], "--api"),
            (["--shard", "http://127.0.0.1:1", "--shard-token", "a", "--shard-token-file", "f"], "--shard-token"),
            (["--shard", "http://127.0.0.1:1", "--auth", "/nonexistent/tokens.yaml"], "--auth"),
        ],
    )
    def test_a_bad_setting_exits_2_naming_it(self, args: list[str], culprit: str) -> None:
        """Each refused setting: exit code 2 and a single error line that names it."""
        result = CliRunner().invoke(app, ["serve", *args])
        assert result.exit_code == 2, result.output
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, lines
        assert lines[0].startswith("error: ")
        assert culprit in lines[0]


class TestServeCommand:
    """`callgate serve` as a process: reads the shard with its shard token, serves its own clients."""

    def test_it_answers_through_the_shard_and_stops_on_sigterm(self, shard: str, tmp_path: Path) -> None:
        """A query through serve is the shard's answer; serve's own token file guards it; SIGTERM ends it with 0."""
        port = free_port()
        tokens = tmp_path / "tokens.yaml"
        tokens.write_text(f"tokens: [{{subject: ci, sha256: {hash_token('ci-secret')}, roles: [auditor]}}]\n")
        log = tmp_path / "access.jsonl"
        command = [sys.executable, "-m", "callgate.cli", "serve", "--shard", shard, "--api", f"127.0.0.1:{port}",
                   "--auth", str(tokens), "--access-log", str(log)]  # fmt: skip
        environment = {**os.environ, "CALLGATE_SHARD_TOKEN": "shard-secret"}
        with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                              env=environment) as process:  # fmt: skip
            try:
                assert process.stdout is not None
                line = process.stdout.readline()
                assert line.startswith(f"read API at http://127.0.0.1:{port} over 1 shards"), line
                url = f"http://127.0.0.1:{port}"
                auth = {"Authorization": "Bearer ci-secret"}
                answer = httpx.get(f"{url}/v1/queries/coverage_summary", headers=auth)
                assert answer.status_code == 200, answer.text
                assert answer.json()["rows"][0]["events"] == 0
                assert httpx.get(f"{url}/v1/queries/coverage_summary").status_code == 401
                assert httpx.get(f"{url}/healthz").json()["shards"] == [
                    {"url": shard, "reachable": True, "status": "ok", "detail": ""}
                ]
                assert '"subject": "ci"' in log.read_text()
            finally:
                process.send_signal(signal.SIGTERM)
                _, errors = process.communicate(timeout=30)
            assert process.returncode == 0, errors
