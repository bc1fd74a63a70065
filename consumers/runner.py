"""The read API's query runner over an audit store: the named queries, on a connection per call."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from consumers.queries import describe_queries, run_query
from consumers.store import AuditStore


class StoreQueryRunner:
    """Runs named queries against a live `AuditStore` (the materializer's, while it writes).

    Each call opens its own cursor, so readers never wait for an ingest and several requests run
    at once. Raises `UnknownQueryError` (a `KeyError`) for an unknown name and `QueryError` (a
    `ValueError`) for a bad parameter, as the read API expects.
    """

    def __init__(self, store: AuditStore) -> None:
        self.store = store

    def names(self) -> list[dict[str, Any]]:
        """Every named query with its description and parameters."""
        return describe_queries()

    def run(self, name: str, params: Mapping[str, str]) -> dict[str, Any]:
        """Run one named query; the JSON-safe result."""
        con = self.store.cursor()
        try:
            return run_query(con, name, params).to_dict()
        finally:
            con.close()
