"""Shared pieces for the whole suite."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from callgate.broker import EmbeddedBroker
from callgate.postgres import LocalPostgres, PostgresError

if os.environ.get("PYTEST_XDIST_WORKER"):
    # A pytest-xdist worker starts with COLUMNS=80 and LINES=24 in its environment, and rich fixes a
    # Console's width from COLUMNS when the Console is built (the command line's, at import): the
    # tests that give the command a wider COLUMNS would get 80 columns there and nowhere else.
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)


# The slowest files first, so that the last files a worker starts are short ones and both workers end
# together. `make test` runs a file's tests on one worker (`--dist loadfile`) and hands out files in
# the order collected (`--no-loadscope-reorder`: xdist's own order, most tests first, put files of a
# few long tests, the browser's and the MCP servers', last, and a worker could finish a minute before
# the other). Seconds of one run (2026-12-05, two workers, a loaded machine); only the order matters,
# and a file not listed keeps its place after these. A file that takes over ~20 s belongs here.
SLOW_FILES = {
    "tests/interceptor_core/integrations/test_mcp_proxy_hostile.py": 262,
    "tests/interceptor_core/integrations/test_mcp_gateway.py": 128,
    "tests/interceptor_core/integrations/test_mcp_proxy_servers.py": 124,
    "tests/consumers/test_materializer.py": 99,
    "tests/consumers/test_lake.py": 97,
    "tests/dashboard/test_browser_login.py": 91,
    "tests/consumers/test_store_contract.py": 66,
    "tests/dashboard/test_browser.py": 64,
    "tests/dashboard/test_approvals_browser.py": 60,
    "tests/callgate/test_tokens.py": 45,
    "tests/dashboard/test_app.py": 45,
    "tests/consumers/test_store.py": 43,
    "tests/events/test_zero_loss.py": 42,
    "tests/test_compose.py": 39,
    "tests/callgate/test_verify.py": 34,
    "tests/callgate/test_demo.py": 32,
    "tests/interceptor_core/integrations/test_mcp_proxy.py": 31,
    "tests/interceptor_core/integrations/test_resume_in_another_process.py": 30,
    "tests/consumers/test_checkpoint_verification.py": 26,
    "tests/consumers/test_approvals.py": 25,
    "tests/interceptor_core/builtins/test_sql_postgres.py": 23,
    "tests/consumers/test_coverage_signed.py": 22,
    "tests/interceptor_core/integrations/test_mcp_proxy_lists.py": 22,
    "tests/dashboard/test_lake.py": 22,
    "tests/consumers/test_proofs.py": 21,
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the files of `SLOW_FILES` first, slowest first; each file's tests keep their order."""
    root = config.rootpath

    def seconds(item: pytest.Item) -> int:
        if not item.path.is_relative_to(root):
            return 0
        return SLOW_FILES.get(item.path.relative_to(root).as_posix(), 0)

    items.sort(key=seconds, reverse=True)  # stable: the rest keep the order collected


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


# A real Redis for the shared call counters: Debian's redis-server on a free loopback port.


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of a redis-server of the session's own (no persistence), answering PING; stopped after.

    Tests share it: each uses a prefix of its own. Fails, never skips, when redis-server is missing.
    """
    server = shutil.which("redis-server")
    if server is None:
        pytest.fail("redis-server is not installed; run `make venv` (it installs Debian's redis-server)", pytrace=False)
    workdir = tmp_path_factory.mktemp("redis")
    log = workdir / "redis.log"
    port = _free_port()
    command = [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    command += ["--daemonize", "no", "--dir", str(workdir), "--logfile", str(log)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        _wait_for_ping(process, port, str(log))
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def closed_redis_url() -> str:
    """A Redis URL on a loopback port nobody listens on: a Redis that is down."""
    return f"redis://127.0.0.1:{_free_port()}/0"


def _wait_for_ping(process: subprocess.Popen[bytes], port: int, log: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    with redis.Redis(port=port, socket_timeout=1, socket_connect_timeout=1) as client:
        while True:
            if process.poll() is not None:
                pytest.fail(f"redis-server exited with {process.returncode}; its log is {log}", pytrace=False)
            try:
                if client.ping():
                    return
            except redis.exceptions.ConnectionError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"redis-server on port {port} did not answer PING in {timeout_s} s; log: {log}")
            time.sleep(0.01)  # sleep-ok: a poll interval inside the deadline loop


# A real PostgreSQL: Debian's server, started as the `postgres` user on a free loopback port.


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """A libpq connection string to a PostgreSQL server of the session's own (trust authentication on
    127.0.0.1, database `postgres`, user `postgres`); stopped, and its directory removed, afterwards.

    Tests share it: each works in a database or schema of its own. Fails, never skips, when the
    server is missing.
    """
    server = LocalPostgres()
    try:
        server.start()
    except PostgresError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield server.dsn
    finally:
        server.stop()
