"""`callgate serve`: the read API over several materializers' stores (shards), until Ctrl-C or SIGTERM.

The same routes, named queries and authentication options as `callgate materialize --api`; the answers
are every shard's, merged as each named query declares (`consumers.federation`). serve reads the shards
with its own bearer token (`--shard-token`, `--shard-token-file` or `CALLGATE_SHARD_TOKEN`), while its
clients authenticate to serve with serve's `--auth` / `--jwt-*`; each shard's access log records serve's
reads, and `--access-log FILE` keeps serve's own record of who asked what (JSON lines).
"""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from consumers.access_log import AccessRecord

__all__ = ["JsonlAccessLog", "ServeError", "read_shard_token", "run_serve"]


class ServeError(Exception):
    """A setting serve cannot start with; the message names it (the command exits 2 with it)."""


class JsonlAccessLog:
    """An `AccessLog` appending one JSON line per named query asked of serve, flushed and fsynced
    before the answer leaves (a record that cannot be written fails the request). Safe from several
    threads."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        try:
            self._file = path.open("a", encoding="utf-8")
        except OSError as exc:
            raise ServeError(f"--access-log {path}: cannot open it for appending ({exc.strerror or exc})") from None

    def record(self, entry: AccessRecord) -> None:
        """Append `entry`; raises `OSError` when it cannot be written."""
        line = json.dumps(
            {
                "time": entry.time.isoformat(),
                "subject": entry.subject,
                "roles": list(entry.roles),
                "query": entry.query,
                "params": dict(entry.params),
                "status": entry.status,
                "row_count": entry.row_count,
                "duration_ms": round(entry.duration_ms, 3),
            },
            default=str,
            sort_keys=True,
        )
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()
            os.fsync(self._file.fileno())

    def close(self) -> None:
        with self._lock:
            self._file.close()


def read_shard_token(token: str | None, token_file: Path | None) -> str | None:
    """The token serve sends to the shards: `token`, or the first line of `token_file`; `ServeError` for
    both, an unreadable file or an empty token."""
    if token is not None and token_file is not None:
        raise ServeError("give --shard-token or --shard-token-file, not both")
    if token_file is not None:
        try:
            token = token_file.read_text(encoding="utf-8").strip().splitlines()[0] if token_file.stat().st_size else ""
        except OSError as exc:
            raise ServeError(f"--shard-token-file {token_file}: cannot read it ({exc.strerror or exc})") from None
    if token is not None and (not token.strip() or any(c in token for c in "\r\n")):
        raise ServeError("the shard token must be a non-empty line of text")
    return None if token is None else token.strip()


def run_serve(
    *,
    shards: Sequence[str],
    shard_token: str | None,
    host: str,
    port: int,
    auth: Any,
    tls: tuple[str, str] | None,
    metrics_open: bool,
    access_log: Path | None,
    shard_ca: Path | None,
    timeout_s: float,
    echo: Callable[[str], None],
    ready: Callable[[str], None] | None = None,
) -> int:
    """Serve until SIGINT/SIGTERM; 0 after a clean stop. Raises `ServeError` for a setting that cannot be
    used (no shard, a malformed shard URL, a port in use, a log that cannot be opened)."""
    from consumers.api import ApiServer, build_app
    from consumers.federation import FederatedRunner, Shard
    from consumers.metrics import MaterializerMetrics

    if not shards:
        raise ServeError("give at least one --shard URL (a materializer's read API)")
    try:
        members = [Shard(url, shard_token) for url in shards]
        runner = FederatedRunner(members, timeout_s=timeout_s, verify=str(shard_ca) if shard_ca else True)
    except ValueError as exc:
        raise ServeError(f"--shard: {exc}") from None
    log = JsonlAccessLog(access_log) if access_log is not None else None
    app = build_app(runner, MaterializerMetrics(), runner.health, auth=auth, access_log=log, metrics_open=metrics_open)
    cert, key = tls or (None, None)
    server = ApiServer(app, host=host, port=port, ssl_certfile=cert, ssl_keyfile=key)
    try:
        server.start()
    except OSError as exc:
        runner.close()
        raise ServeError(f"--api {host}:{port}: cannot listen there ({exc.strerror or exc})") from None
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        echo(f"read API at {server.url} over {len(members)} shards: {', '.join(s.url for s in runner.shards)}")
        if ready is not None:
            ready(server.url)
        stop.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        server.stop()
        runner.close()
        if log is not None:
            log.close()
    return 0
