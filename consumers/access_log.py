"""The read API's access log: who ran which named query, with what, and what came back.

Every named query asked of the read API (answered 200, 400, 403 or 404; refused for want of a
valid token, 401 with an empty subject; without authentication by subject "anonymous") is one
`AccessRecord`, appended to the store's `access_log` table before the answer leaves, and read back
with the named query `access_log` (admin only). The materializer's process holds the store's
writer, so the API writes through it (`StoreAccessLog`).

A record that cannot be written fails the request (500), the rows are not sent, and the API's
`/healthz` answers 503 until a record is written again: a read that leaves no trace must not pass
silently. Reads of a store file directly (`FileReader`, the dashboard's `--db` mode) are not
recorded: nobody else can hold that file then, and the file's own permissions are its access control.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from consumers.store import AuditStore

__all__ = ["AccessLog", "AccessRecord", "StoreAccessLog"]


@dataclass(frozen=True, slots=True)
class AccessRecord:
    """One named query asked of the read API."""

    time: datetime
    """When the request arrived (UTC)."""
    subject: str
    """Who asked (the token's subject; "anonymous" without authentication; "" when refused, 401)."""
    roles: tuple[str, ...]
    query: str
    params: Mapping[str, Any]
    """The parameters as run: a tenant token's tenant bound in; as given when refused."""
    status: int
    """The HTTP status answered (200, 400, 401, 403, 404)."""
    row_count: int | None
    """Rows returned (None unless 200)."""
    duration_ms: float


class AccessLog(Protocol):
    """Where access records go. `record` blocks until the record is kept and raises when it cannot be;
    safe from several threads."""

    def record(self, entry: AccessRecord) -> None: ...


class StoreAccessLog:
    """Appends access records to the `access_log` table of a writable `AuditStore`, one insert on a
    cursor of its own per record (a few milliseconds; it never waits for an ingest's transaction).
    Raises DuckDB's error when the insert fails. Safe from several threads."""

    def __init__(self, store: AuditStore) -> None:
        self.store = store

    def record(self, entry: AccessRecord) -> None:
        """Append `entry`; see the class docstring."""
        con = self.store.cursor()
        try:
            con.execute(
                "INSERT INTO access_log VALUES ($time, $subject, $roles, $query, $params, $status, $rows, $ms)",
                {
                    "time": entry.time,
                    "subject": entry.subject,
                    "roles": list(entry.roles),
                    "query": entry.query,
                    "params": json.dumps(dict(entry.params), default=str, sort_keys=True),
                    "status": entry.status,
                    "rows": entry.row_count,
                    "ms": round(entry.duration_ms, 3),
                },
            )
        finally:
            con.close()
