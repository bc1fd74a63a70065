"""A real Redis for the counter tests: Debian's redis-server on a free loopback port."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest
import redis


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
            time.sleep(0.01)  # a poll interval inside the deadline loop, not a wait for something
