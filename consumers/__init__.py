"""The audit pipeline's consumer side: the DuckDB audit store and the named queries readers run.

Importing this package loads DuckDB and pyarrow (the store needs them); `events` and
`interceptor_core` never import it.
"""

from consumers.queries import (
    MAX_LIMIT,
    QUERIES,
    NamedQuery,
    Param,
    ParamValue,
    QueryError,
    QueryResult,
    UnknownQueryError,
    describe_queries,
    run_query,
)
from consumers.store import (
    DEFAULT_MAX_VALUE_BYTES,
    MIGRATIONS,
    SCHEMA_VERSION,
    AuditStore,
    IngestResult,
    KafkaRecord,
    Migration,
    RawRecord,
    StoreCounts,
    StoreError,
    StoreLockedError,
    connect,
)

__all__ = [
    "DEFAULT_MAX_VALUE_BYTES",
    "MAX_LIMIT",
    "MIGRATIONS",
    "QUERIES",
    "SCHEMA_VERSION",
    "AuditStore",
    "IngestResult",
    "KafkaRecord",
    "Migration",
    "NamedQuery",
    "Param",
    "ParamValue",
    "QueryError",
    "QueryResult",
    "RawRecord",
    "StoreCounts",
    "StoreError",
    "StoreLockedError",
    "UnknownQueryError",
    "connect",
    "describe_queries",
    "run_query",
]
