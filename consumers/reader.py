"""Reading the audit store from outside the materializer: through its read API or from a file.

Every reader (the coverage check, the dashboard) runs named queries through an `AuditReader`, so it
never knows which way the data comes:

- `ApiReader(url, token=...)`: `GET {url}/v1/queries/<name>?...` on a running materializer
  (`--api`), with `Authorization: Bearer <token>` when a token is given. The only way while the
  materializer holds the file: DuckDB lets no other process open it.
- `FileReader(path)`: the named queries on the file opened read-only, for offline audits and CI
  after `callgate materialize --drain`; `FileReader(lake)` on a lake (`consumers.lake`), read
  directly while materializers write it.

`open_reader(api=..., db=..., token=...)` picks one. Both raise `SourceUnavailableError` when they
cannot read at all (API down, file missing or held by a writer, schema newer than this code): a
caller that must not mistake "could not look" for "nothing found" treats it apart from every other
answer. A read API that refuses the token (401) or the query (403) raises `AccessDeniedError`, a
`SourceUnavailableError` whose message says which and what to do.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, Self

import duckdb

from consumers.lake import Lake, LakeError
from consumers.queries import QueryError, QueryResult, UnknownQueryError, run_query
from consumers.store import AuditStore, StoreError, StoreLockedError

__all__ = ["AccessDeniedError", "ApiReader", "AuditReader", "FileReader", "SourceUnavailableError", "open_reader"]

DEFAULT_TIMEOUT_S = 10.0


class SourceUnavailableError(Exception):
    """The audit store could not be read at all; `source` names it (a URL or a file) and the message
    says why and what to do. Distinct from a query's own errors on purpose: it means "unknown", never
    "empty"."""

    def __init__(self, source: str, message: str) -> None:
        super().__init__(message)
        self.source = source


class AccessDeniedError(SourceUnavailableError):
    """The read API refused the reader: `status` 401 (no token, or one it does not accept) or 403 (the
    token's roles do not allow the query or the tenant asked). The message names the API, the query
    and the server's reason."""

    def __init__(self, source: str, message: str, *, status: int) -> None:
        super().__init__(source, message)
        self.status = status


class AuditReader(Protocol):
    """Runs the consumers' named queries somewhere; blocking, one query per call."""

    @property
    def source(self) -> str:
        """Where the data comes from, for messages (the API's URL or the file's path)."""
        ...

    def query(self, name: str, params: Mapping[str, Any] | None = None) -> QueryResult:
        """Run one named query. Raises `UnknownQueryError` / `QueryError` for a bad name or
        parameter and `SourceUnavailableError` when the store cannot be reached."""
        ...

    def close(self) -> None:
        """Release what the reader holds (a file lock); idempotent."""
        ...


class ApiReader:
    """Named queries through a materializer's read API. Safe from several threads (one request per
    call, nothing shared).

    `token` is sent as `Authorization: Bearer <token>` on every request (None: no header). An https
    URL is verified against the system's trusted certificates (or `SSL_CERT_FILE`), or against
    `ssl_context` when one is given.
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"the read API's URL must look like http://HOST:PORT, got {url!r}")
        if token is not None and (not token.strip() or any(c in token for c in "\r\n")):
            raise ValueError("the read API token must be a non-empty line of text")
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._token = None if token is None else token.strip()
        self._ssl_context = ssl_context

    def __repr__(self) -> str:
        # Never the token.
        return f"ApiReader({self.url!r}, token={'set' if self._token else None})"

    @property
    def source(self) -> str:
        return self.url

    def query(self, name: str, params: Mapping[str, Any] | None = None) -> QueryResult:
        query = {key: _param_text(value) for key, value in (params or {}).items() if value is not None}
        path = f"/v1/queries/{urllib.parse.quote(name, safe='')}"
        status, body = self._get(path + (f"?{urllib.parse.urlencode(query)}" if query else ""))
        if status == 404:
            raise UnknownQueryError(_message(body) or f"unknown query {name!r}", query=name)
        if status == 400:
            raise QueryError(_message(body) or f"bad parameters for query {name!r}", query=name)
        if status == 401:
            hint = (
                "give a valid one with --token or CALLGATE_TOKEN"
                if self._token
                else "give one with --token or CALLGATE_TOKEN"
            )
            raise AccessDeniedError(
                self.url,
                f"the read API at {self.url} needs a token it accepts ({_message(body)}): {hint}",
                status=401,
            )
        if status == 403:
            raise AccessDeniedError(
                self.url,
                f"the read API at {self.url} refused query {name!r} for this token: {_message(body)}",
                status=403,
            )
        if status != 200:
            raise SourceUnavailableError(
                self.url, f"the read API at {self.url} answered {status} to query {name!r}: {_message(body)}"
            )
        data = json.loads(body)
        return QueryResult(str(data["query"]), dict(data["params"]), tuple(data["columns"]), list(data["rows"]))

    def health(self) -> dict[str, Any]:
        """The materializer's `/healthz` answer (its `status` is "ok" or "unavailable")."""
        _, body = self._get("/healthz")
        return dict(json.loads(body))

    def _get(self, path: str) -> tuple[int, bytes]:
        # The scheme was checked to be http(s) when the reader was built.
        headers = {"Accept": "application/json"}
        if self._token is not None:
            headers["Authorization"] = f"Bearer {self._token}"
        request = urllib.request.Request(self.url + path, headers=headers)  # noqa: S310
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s, context=self._ssl_context) as response:  # noqa: S310
                return int(response.status), response.read()
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read()
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise SourceUnavailableError(
                self.url,
                f"cannot reach the read API at {self.url} ({reason}); is `callgate materialize ... --api` running?",
            ) from exc

    def close(self) -> None:
        pass

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class FileReader:
    """Named queries on an audit store file opened read-only, on first use.

    While it is open no process can open the file for writing (DuckDB's lock): close it when done.
    Safe from several threads (a cursor per query).
    """

    def __init__(self, path: str | Path | Lake) -> None:
        self.path: Path | Lake = path if isinstance(path, Lake) else Path(path)
        """The file, or the lake (read while materializers write it: a lake takes no lock)."""
        self._store: AuditStore | None = None

    @property
    def source(self) -> str:
        return str(self.path)

    def query(self, name: str, params: Mapping[str, Any] | None = None) -> QueryResult:
        con = self._open().cursor()
        try:
            return run_query(con, name, params)
        finally:
            con.close()

    def _open(self) -> AuditStore:
        if self._store is not None:
            return self._store
        if isinstance(self.path, Path) and not self.path.is_file():
            raise SourceUnavailableError(str(self.path), f"no audit store at {self.path}: the file does not exist")
        try:
            self._store = AuditStore(self.path, read_only=True)
        except StoreLockedError as exc:
            raise SourceUnavailableError(str(self.path), str(exc)) from exc
        except (StoreError, LakeError, duckdb.Error) as exc:
            raise SourceUnavailableError(str(self.path), f"cannot read {self.path} as an audit store: {exc}") from exc
        return self._store

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def open_reader(
    *, api: str | None = None, db: str | Path | Lake | None = None, token: str | None = None
) -> ApiReader | FileReader:
    """The reader for exactly one of `api` (a read API URL, sent `token` as a bearer token) or `db`
    (a store file; `token` is ignored there: the file's permissions are its access control);
    `ValueError` for both or neither."""
    if (api is None) == (db is None):
        raise ValueError("give exactly one of api (the read API's URL) or db (an audit store file)")
    return ApiReader(api, token=token or None) if api is not None else FileReader(db)  # type: ignore[arg-type]


def _param_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if hasattr(value, "isoformat"):
        return str(value.isoformat())
    return str(value)


def _message(body: bytes) -> str:
    try:
        return str(json.loads(body).get("error", ""))
    except (ValueError, AttributeError):
        return body[:200].decode("utf-8", "replace")
