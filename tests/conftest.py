"""Shared pieces for the whole suite."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from callgate.broker import EmbeddedBroker

if os.environ.get("PYTEST_XDIST_WORKER"):
    # A pytest-xdist worker starts with COLUMNS=80 and LINES=24 in its environment, and rich fixes a
    # Console's width from COLUMNS when the Console is built (the command line's, at import): the
    # tests that give the command a wider COLUMNS would get 80 columns there and nowhere else.
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)


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


def _postgres_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        pytest.fail("PostgreSQL is not installed; run `make venv` (it installs Debian's postgresql)", pytrace=False)
    return found[-1]


def _as_postgres(command: list[str]) -> list[str]:
    """The command run as the `postgres` user when we are root (the server refuses to run as root)."""
    if os.geteuid() != 0:
        return command
    return ["runuser", "-u", "postgres", "--", *command]


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """A libpq connection string to a PostgreSQL server of the session's own (trust authentication on
    127.0.0.1, database `postgres`, user `postgres`); stopped, and its directory removed, afterwards.

    Tests share it: each works in a database or schema of its own. Fails, never skips, when the
    server is missing.
    """
    # Outside pytest's own temporary root, which only our user may enter: the server runs as `postgres`.
    workdir = Path(tempfile.mkdtemp(prefix="callgate-postgres-"))
    workdir.chmod(0o777)  # the server runs as its own user and writes its cluster here
    data = workdir / "data"
    initdb = _as_postgres([_postgres_bin("initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync"])
    subprocess.run(initdb, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    port = _free_port()
    options = f"-p {port} -k {workdir} -c listen_addresses=127.0.0.1 -c fsync=off"
    pg_ctl = _postgres_bin("pg_ctl")
    log = workdir / "postgres.log"
    start = [pg_ctl, "-D", str(data), "-l", str(log), "-o", options, "-w", "-t", "30", "start"]
    subprocess.run(_as_postgres(start), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        yield f"host=127.0.0.1 port={port} user=postgres dbname=postgres"
    finally:
        stop = [pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop"]
        subprocess.run(_as_postgres(stop), check=False, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        shutil.rmtree(workdir, ignore_errors=True)
