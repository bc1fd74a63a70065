"""A throwaway PostgreSQL for a lake's catalog in tests, benchmarks and the fault drill.

`LocalPostgres` runs Debian's server (`/usr/lib/postgresql/*/bin`) on a free loopback port with trust
authentication, in a directory of its own that `stop()` removes: the PostgreSQL a lake's catalog
lives in when nothing else provides one. Run as root, the server runs as the `postgres` user (it
refuses root). Everything here is synchronous and blocking. Not for production: no password, no
durability (`fsync=off`).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path
from types import TracebackType
from typing import Self

from callgate.broker import free_port

__all__ = ["LocalPostgres", "PostgresError"]

HOST = "127.0.0.1"


class PostgresError(RuntimeError):
    """PostgreSQL is not installed, or its server did not start; the message says which and where its log is."""


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise PostgresError("PostgreSQL is not installed; run `make venv` (it installs Debian's postgresql)")
    return found[-1]


def _as_postgres(command: list[str]) -> list[str]:
    """The command run as the `postgres` user when we are root (the server refuses to run as root)."""
    if os.geteuid() != 0:
        return command
    return ["runuser", "-u", "postgres", "--", *command]


def _run(command: list[str], *, check: bool) -> None:
    """One of PostgreSQL's own programs, as the `postgres` user when we are root, its output discarded."""
    subprocess.run(  # noqa: S603 - a fixed argument list, no shell
        _as_postgres(command), check=check, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )


class LocalPostgres:
    """One PostgreSQL server on `127.0.0.1:port` (database `postgres`, user `postgres`, trust
    authentication); `dsn` is its libpq connection string once started. Usable as a context manager.
    Not thread-safe: drive one instance from one thread."""

    def __init__(self, prefix: str = "callgate-postgres-") -> None:
        self._prefix = prefix
        self._workdir: Path | None = None
        self.port = 0

    @property
    def dsn(self) -> str:
        """The libpq connection string of the server's `postgres` database."""
        if self._workdir is None:
            raise PostgresError("the server is not started")
        return f"host={HOST} port={self.port} user=postgres dbname=postgres"

    def start(self) -> Self:
        """initdb a new cluster and start the server; returns once it accepts connections. Raises
        `PostgresError` when it is not installed or does not start (its directory is removed then)."""
        initdb, pg_ctl = _bin("initdb"), _bin("pg_ctl")
        # Outside any directory only our user may enter: the server runs as `postgres`.
        workdir = Path(tempfile.mkdtemp(prefix=self._prefix))
        workdir.chmod(0o777)  # the server runs as its own user and writes its cluster here
        data, log = workdir / "data", workdir / "postgres.log"
        try:
            _run([initdb, "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync"], check=True)
            self.port = free_port(HOST)
            options = f"-p {self.port} -k {workdir} -c listen_addresses={HOST} -c fsync=off"
            _run([pg_ctl, "-D", str(data), "-l", str(log), "-o", options, "-w", "-t", "30", "start"], check=True)
        except subprocess.CalledProcessError as exc:
            tail = log.read_text(errors="replace").strip().splitlines()[-3:] if log.exists() else []
            shutil.rmtree(workdir, ignore_errors=True)
            raise PostgresError(f"PostgreSQL did not start ({exc}): {tail}") from exc
        self._workdir = workdir
        return self

    def stop(self) -> None:
        """Stop the server at once (no checkpoint) and remove its directory. Idempotent."""
        workdir, self._workdir = self._workdir, None
        if workdir is None:
            return
        _run([_bin("pg_ctl"), "-D", str(workdir / "data"), "-m", "immediate", "-w", "stop"], check=False)
        shutil.rmtree(workdir, ignore_errors=True)

    def new_database(self, prefix: str = "lake_") -> str:
        """Create a database of a new name; its libpq connection string (same server, same user)."""
        import psycopg

        name = f"{prefix}{uuid.uuid4().hex}"
        with psycopg.connect(self.dsn, autocommit=True) as con:
            con.execute(f'CREATE DATABASE "{name}"')
        return self.dsn.replace("dbname=postgres", f"dbname={name}")

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
