"""The materializer's read API: health, Prometheus metrics and the named queries over HTTP.

DuckDB lets no other process open a database file that one process holds for writing, so while the
materializer runs, readers (the dashboard, the coverage job) reach the store through this API. It is
a small Starlette app (`build_app`) served by uvicorn in a background thread (`ApiServer`).

Routes (GET only, but for the approvals write routes; HEAD is answered as GET without a body; any
other method is 405):

- `GET /healthz`: 200 `{"status": "ok", ...}` or 503 `{"status": "unavailable", ...}` (`HealthStatus`),
  with one entry per partition the broker lists (`PartitionHealth`). Never needs a token.
- `GET /metrics`: the Prometheus text exposition of `MaterializerMetrics`; an `admin` token unless
  `metrics_open`.
- `GET /v1/queries`: 200 `{"queries": [...]}`, what `QueryRunner.names()` lists; any valid token.
- `POST /v1/approvals/{approval_id}` (only with a reviewer's desk, `consumers.approvals`): a
  reviewer decides a pending approval request; `POST /v1/approvals/{approval_id}/claim`: the gate
  about to run an approved call claims its approval, granted once per approval id.
- `GET /v1/queries/{name}?param=value...`: 200 with the query's result; 404 for an unknown query,
  400 for a bad parameter, 403 for a query or tenant the token's roles do not allow, 500
  `{"error": "internal error"}` for anything else (traceback logged).

With an `Authenticator` (`consumers.auth`), every route but `/healthz` needs `Authorization: Bearer
<token>`: missing or refused credentials are 401 with `WWW-Authenticate: Bearer`. The parameters of
every named query pass `consumers.auth.scope_params` (a tenant token's tenant is bound there), and
each query asked is appended to the `AccessLog` before the answer leaves, refused ones (401, with
no subject) included; a record that cannot be written answers 500 instead of the rows, and
`/healthz` answers 503 until a record is written again. Paths are matched as written: a trailing
slash is a 404, never a redirect. Without an authenticator every request reads as
`consumers.auth.ANONYMOUS` (everything; loopback or `--insecure-no-auth` only).

Every error body is `{"error": "<message>"}`.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, Self

import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from consumers.access_log import AccessLog, AccessRecord
from consumers.auth import ANONYMOUS, Authenticator, AuthError, Forbidden, Identity, scope_params
from consumers.metrics import MaterializerMetrics

if TYPE_CHECKING:
    from consumers.approvals import ApprovalDesk

__all__ = ["ApiServer", "Health", "HealthStatus", "PartitionHealth", "QueryRunner", "RunnerError", "build_app"]

log = logging.getLogger(__name__)


class RunnerError(Exception):
    """A query the runner cannot answer for a reason that is neither the caller's parameters nor a bug:
    answered with `status_code` (503: the store cannot be read now) and the message as the error."""

    def __init__(self, message: str, *, status_code: int) -> None:
        super().__init__(message)
        self.status_code = status_code


class Health(Protocol):
    """What `GET /healthz` answers: `ok` picks 200 or 503, `to_json()` is the body (`HealthStatus`
    for a materializer; serve reports its shards)."""

    @property
    def ok(self) -> bool: ...

    def to_json(self) -> dict[str, Any]: ...


class QueryRunner(Protocol):
    """The named, parameterized read queries the API serves.

    Both methods block (they may read DuckDB) and are called from worker threads, several at once:
    an implementation must be safe for that (for DuckDB, one cursor per call).
    """

    def names(self) -> list[dict[str, Any]]:
        """Every query: `{"name", "description", "parameters": [{"name", "type", "default", ...}]}`,
        JSON-safe."""
        ...

    def run(self, name: str, params: Mapping[str, str]) -> dict[str, Any]:
        """Run query `name` with `params` as given in the query string (strings; the runner converts them).

        Returns a JSON-safe `{"columns": [...], "rows": [{...}, ...], ...}`. Raises `KeyError` for an
        unknown query name and a `ValueError` subclass, whose message names the parameter, for a
        missing, unknown or malformed parameter; `RunnerError` to answer its status and message.
        """
        ...


@dataclass(frozen=True, slots=True)
class PartitionHealth:
    """One partition the broker lists for the topic, as the materializer sees it."""

    partition: int
    owned: bool
    """Whether this materializer reads the partition (it is assigned to it)."""
    position: int | None = None
    """The next offset this materializer reads (owned partitions, once known)."""
    high_watermark: int | None = None
    """The partition's end offset as last seen (None before it is known)."""
    lag: int | None = None
    """Records between what is read (the position; for a partition this materializer does not own, the
    group's committed offset or the store's) and the high watermark."""
    unread_s: float = 0.0
    """How long the partition has gone without a reader, or with records waiting and its reading not
    moving (0 while it is read)."""

    def to_json(self) -> dict[str, Any]:
        """The partition's entry in `GET /healthz`'s `partitions` list."""
        return {
            "partition": self.partition,
            "owned": self.owned,
            "position": self.position,
            "high_watermark": self.high_watermark,
            "lag": self.lag,
            "unread_s": self.unread_s,
        }


@dataclass(frozen=True, slots=True)
class HealthStatus:
    """What the materializer reports at `GET /healthz`.

    `ok` False (the consumer loop died, the store cannot be written, ...) makes the route answer 503;
    `detail` says why in words a person can act on. The optional fields are shown when known.
    """

    ok: bool
    """Whether the materializer is doing its job."""
    detail: str = ""
    """Why it is not ok, or a short note when it is."""
    last_batch_at: datetime | None = None
    """When the consumer last committed a batch (UTC)."""
    last_event_at: datetime | None = None
    """The newest event time stored (UTC)."""
    lag_total: int | None = None
    """Messages not yet consumed, summed over every partition the broker lists (see `PartitionHealth.lag`)."""
    topic: str | None = None
    """The topic consumed."""
    partitions: tuple[PartitionHealth, ...] = ()
    """Every partition the broker lists for `topic`, in partition order."""

    def to_json(self) -> dict[str, Any]:
        """The JSON body of `GET /healthz`: `status` is "ok" or "unavailable"; datetimes are ISO 8601."""
        return {
            "status": "ok" if self.ok else "unavailable",
            "detail": self.detail,
            "last_batch_at": None if self.last_batch_at is None else self.last_batch_at.isoformat(),
            "last_event_at": None if self.last_event_at is None else self.last_event_at.isoformat(),
            "lag_total": self.lag_total,
            "topic": self.topic,
            "partitions": [partition.to_json() for partition in self.partitions],
        }


class _JSONResponse(JSONResponse):
    """JSON that does not fail on values a runner forgot to convert: unknown types become `str`,
    NaN and infinities become null."""

    def render(self, content: Any) -> bytes:
        try:
            text = _dumps(content)
        except ValueError:
            # A DOUBLE column can hold NaN or inf, which JSON cannot carry; null is what readers can parse.
            text = _dumps(_finite(content))
        return text.encode("utf-8")


def _dumps(content: Any) -> str:
    return json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=str)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def _error(status_code: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    return _JSONResponse({"error": message}, status_code=status_code, headers=headers)


_INTERNAL_ERROR = "internal error"

Endpoint = Callable[[Request], Awaitable[Response]]


def _guarded(endpoint: Endpoint) -> Endpoint:
    """The endpoint, answering 500 with a fixed message for any exception; the traceback goes to the
    log, never to the client (it may hold SQL, paths or data)."""

    @functools.wraps(endpoint)
    async def guarded(request: Request) -> Response:
        try:
            return await endpoint(request)
        except Exception:
            log.exception("read API: %s %r failed", request.method, request.url.path)
            return _error(500, _INTERNAL_ERROR)

    return guarded


_CHALLENGE = 'Bearer realm="callgate"'


def _unauthorized(message: str, *, bad_token: bool) -> Response:
    challenge = f'{_CHALLENGE}, error="invalid_token"' if bad_token else _CHALLENGE
    return _error(401, message, {"WWW-Authenticate": challenge})


def _bearer(request: Request) -> str:
    """The request's bearer token; `AuthError` when it has none."""
    header = request.headers.get("authorization")
    if header is None:
        raise AuthError("this read API needs a token: send Authorization: Bearer <token>")
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthError("the Authorization header must be: Bearer <token>")
    return token.strip()


def build_app(
    runner: QueryRunner,
    metrics: MaterializerMetrics,
    health: Callable[[], Health],
    *,
    auth: Authenticator | None = None,
    access_log: AccessLog | None = None,
    metrics_open: bool = False,
    approvals: ApprovalDesk | None = None,
) -> Starlette:
    """The read API as a Starlette app (routes and authentication in the module docstring).

    `runner`, `health`, `auth` and `access_log` are called in worker threads, so a slow query, a
    health check waiting for a lock or a JWKS fetch never stalls other requests. `health` raising
    counts as unavailable (503, logged). `auth` None serves without authentication; `access_log`
    None records nothing; `metrics_open` serves `/metrics` to anybody. `approvals` (a reviewer's
    desk) adds the write routes `POST /v1/approvals/{approval_id}` and its `/claim`
    (`consumers.approvals`).
    """

    # Why the last access record could not be written, until one is again: /healthz answers 503
    # meanwhile, since every read is refused while the log cannot take its record.
    log_failure: list[str] = []

    async def record(entry: AccessRecord) -> bool:
        """Append `entry` to the access log; False (logged, and /healthz unavailable) when it cannot."""
        if access_log is None:
            return True
        try:
            await run_in_threadpool(access_log.record, entry)
        except Exception as exc:
            log.exception("read API: cannot record %r's query %r in the access log", entry.subject, entry.query)
            log_failure[:] = [f"{type(exc).__name__}: {exc}"]
            return False
        log_failure.clear()
        return True

    async def identify(request: Request) -> Identity | Response:
        """The caller's identity, or the 401 to answer."""
        if auth is None:
            return ANONYMOUS
        try:
            token = _bearer(request)
        except AuthError as exc:
            return _unauthorized(str(exc), bad_token=False)
        try:
            return await run_in_threadpool(auth.authenticate, token)
        except AuthError as exc:
            log.warning("read API: %s %s refused a token: %s", request.method, request.url.path, exc)
            return _unauthorized(f"the token was refused: {exc}", bad_token=True)

    async def healthz(request: Request) -> Response:
        try:
            status = await run_in_threadpool(health)
        except Exception:
            log.exception("read API: the health check raised")
            return _JSONResponse({"status": "unavailable", "detail": "health check failed"}, status_code=503)
        body = status.to_json()
        if log_failure:
            detail = f"the access log cannot be written ({log_failure[0]}): every read is refused"
            body.update(status="unavailable", detail=f"{detail}; {body['detail']}" if body.get("detail") else detail)
            return _JSONResponse(body, status_code=503)
        return _JSONResponse(body, status_code=200 if status.ok else 503)

    async def metrics_text(request: Request) -> Response:
        if not metrics_open:
            identity = await identify(request)
            if isinstance(identity, Response):
                return identity
            if not identity.admin:
                return _error(403, "/metrics needs the admin role")
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    async def list_queries(request: Request) -> Response:
        identity = await identify(request)
        if isinstance(identity, Response):
            return identity
        return _JSONResponse({"queries": await run_in_threadpool(runner.names)})

    async def run_query(request: Request) -> Response:
        started, at = time.perf_counter(), datetime.now(UTC)
        name: str = request.path_params["name"]
        params: dict[str, Any] = {}
        repeated = None
        for key, value in request.query_params.multi_items():
            if key in params:
                repeated = key
            params[key] = value
        identity = await identify(request)
        if isinstance(identity, Response):
            # A refused caller is recorded too (no subject): probing leaves a trace. Nothing was
            # sent, so the 401 stands even when the record cannot be written.
            await record(AccessRecord(at, "", (), name, params, identity.status_code, None, _ms_since(started)))
            return identity
        response, rows = await answer(name, params, identity, repeated)
        entry = AccessRecord(
            time=at,
            subject=identity.subject,
            roles=tuple(sorted(identity.roles)),
            query=name,
            params=params,
            status=response.status_code,
            row_count=rows,
            duration_ms=_ms_since(started),
        )
        if not await record(entry):
            # An unrecorded read must not pass silently: the rows are withheld.
            return _error(500, "the read could not be recorded in the access log; nothing was sent")
        return response

    async def answer(
        name: str, params: dict[str, Any], identity: Identity, repeated: str | None
    ) -> tuple[Response, int | None]:
        """The response to query `name` and the rows it carries (None unless 200); `params` is
        updated in place to what was run (a tenant bound), for the access log."""
        if repeated is not None:
            return _error(400, f"parameter {repeated!r} is given more than once"), None
        if auth is not None:
            try:
                params.update(scope_params(name, params, identity))
            except Forbidden as exc:
                return _error(403, str(exc)), None
            except KeyError:  # UnknownQueryError
                return _error(404, f"unknown query {name!r}"), None
            except ValueError as exc:  # QueryError
                return _error(400, str(exc)), None
        try:
            result = await run_in_threadpool(runner.run, name, params)
        except KeyError:
            known = {query.get("name") for query in await run_in_threadpool(runner.names)}
            if name not in known:
                return _error(404, f"unknown query {name!r}"), None
            # A KeyError from inside a known query is a bug in it, not a wrong name.
            log.exception("read API: query %r raised KeyError", name)
            return _error(500, _INTERNAL_ERROR), None
        except ValueError as exc:
            return _error(400, str(exc) or f"bad parameters for query {name!r}"), None
        except RunnerError as exc:
            return _error(exc.status_code, str(exc)), None
        rows = result.get("rows")
        return _JSONResponse(result), len(rows) if isinstance(rows, list) else None

    async def http_error(request: Request, exc: Exception) -> Response:
        # Starlette raises HTTPException for unmatched paths (404) and methods (405, with Allow).
        if not isinstance(exc, HTTPException):  # registered for HTTPException only
            raise exc
        path = request.url.path
        if exc.status_code == 404 and len(path) > 1 and path.endswith("/"):
            return _error(404, f"no route {path}: the routes have no trailing slash")
        return _error(exc.status_code, exc.detail, exc.headers)

    routes = [
        Route("/healthz", _guarded(healthz), methods=["GET"]),
        Route("/metrics", _guarded(metrics_text), methods=["GET"]),
        Route("/v1/queries", _guarded(list_queries), methods=["GET"]),
        Route("/v1/queries/{name}", _guarded(run_query), methods=["GET"]),
    ]
    if approvals is not None:
        from consumers.approvals import approval_routes

        routes += [
            Route(route.path, _guarded(route.endpoint), methods=["POST"])
            for route in approval_routes(approvals, identify, access_log)
        ]
    app = Starlette(
        routes=routes,
        exception_handlers={HTTPException: http_error},
    )
    # Starlette would redirect `/v1/queries/` to a Location built from the request's Host header,
    # which the client chose: a 404 that names the route instead.
    app.router.redirect_slashes = False
    return app


def _ms_since(started: float) -> float:
    return (time.perf_counter() - started) * 1000


class _Server(uvicorn.Server):
    """uvicorn's server, telling a waiting thread the moment it serves (instead of being polled)."""

    def __init__(self, config: uvicorn.Config, ready: threading.Event) -> None:
        super().__init__(config)
        self._ready = ready

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        self._ready.set()


def _bind(host: str, port: int) -> socket.socket:
    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.create_server(address, family=family)
    # Accepted connections inherit it: without it a keep-alive client (httpx, a reader paging through
    # a query) waits out its delayed ACK, about 40 ms, on every answer written in two parts.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class ApiServer:
    """Serves an ASGI app (normally `build_app(...)`) with uvicorn from a background thread.

    The socket is bound in `start()`, in the caller's thread, so a port in use raises `OSError` there;
    port 0 picks a free port, and `address`/`url` report the real one. Loopback by default. One
    server runs once: `start` after `stop` raises `RuntimeError`. Usable as a context manager.
    `start` and `stop` block and may be called from any thread (not from the app's own requests).

    uvicorn logs at `log_level` ("warning" by default) without an access log, and its logging
    configuration is left to the application (`log_config=None`).

    `ssl_certfile` and `ssl_keyfile` (PEM, given together) serve HTTPS with uvicorn's own TLS;
    `url` then starts with https. A certificate or key that cannot be loaded raises from `start()`.
    """

    def __init__(
        self,
        app: Starlette,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        log_level: str = "warning",
        access_log: bool = False,
        start_timeout: float = 10.0,
        stop_timeout: float = 10.0,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
    ) -> None:
        if (ssl_certfile is None) != (ssl_keyfile is None):
            raise ValueError("give both ssl_certfile and ssl_keyfile, or neither")
        self._ssl_certfile = ssl_certfile
        self._ssl_keyfile = ssl_keyfile
        self._app = app
        self._host = host
        self._port = port
        self._log_level = log_level
        self._access_log = access_log
        self._start_timeout = start_timeout
        self._stop_timeout = stop_timeout
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._server: _Server | None = None
        self._address: tuple[str, int] | None = None
        self._failure: BaseException | None = None
        self._stopped = False

    @property
    def address(self) -> tuple[str, int]:
        """The bound (host, port), e.g. ("127.0.0.1", 53121). Raises `RuntimeError` before `start()`."""
        if self._address is None:
            raise RuntimeError("ApiServer has not been started")
        return self._address

    @property
    def url(self) -> str:
        """The base URL, e.g. "http://127.0.0.1:53121" (https with TLS; no trailing slash). Raises
        `RuntimeError` before `start()`."""
        host, port = self.address
        scheme = "https" if self._ssl_certfile is not None else "http"
        return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"

    def start(self) -> None:
        """Bind, start serving, and return once requests are answered.

        Raises `OSError` if the address cannot be bound, `RuntimeError` if the server was started
        before or failed to start, `TimeoutError` if it did not serve within `start_timeout` seconds
        (it is stopped again in both cases).
        """
        with self._lock:
            if self._thread is not None:
                raise RuntimeError("ApiServer can be started only once")
            sock = _bind(self._host, self._port)
            try:
                host, port = sock.getsockname()[:2]
                config = uvicorn.Config(
                    self._app,
                    host=host,
                    port=port,
                    log_config=None,
                    log_level=self._log_level,
                    access_log=self._access_log,
                    lifespan="off",
                    # Requests still running after this many seconds of shutdown are cancelled.
                    timeout_graceful_shutdown=max(1, int(self._stop_timeout / 2)),
                    ssl_certfile=self._ssl_certfile,
                    ssl_keyfile=self._ssl_keyfile,
                )
                # Loaded here, so a bad certificate or key raises in the caller, not in the thread.
                config.load()
                server = _Server(config, self._ready)
                thread = threading.Thread(
                    target=self._serve, args=(server, sock), name=f"callgate-api-{port}", daemon=True
                )
                thread.start()
            except BaseException:
                sock.close()
                raise
            self._address = (host, port)
            self._server, self._thread = server, thread
        if not self._ready.wait(self._start_timeout):
            self.stop()
            raise TimeoutError(f"read API did not start within {self._start_timeout} s on {self.url}")
        if not server.started:
            self.stop()
            raise RuntimeError(f"read API failed to start on {self.url}") from self._failure
        log.info("read API serving on %s", self.url)

    def _serve(self, server: _Server, sock: socket.socket) -> None:
        try:
            server.run(sockets=[sock])
        except BaseException as exc:  # uvicorn ends a failed startup with SystemExit, which a thread would swallow
            self._failure = exc
            log.exception("read API server stopped with an error")
        finally:
            sock.close()
            self._ready.set()

    def stop(self) -> None:
        """Stop accepting connections, let running requests finish (cancelled after about half of
        `stop_timeout`), and join the thread. Idempotent; a no-op before `start()`.

        Raises `TimeoutError` if the thread has not ended within `stop_timeout` seconds.
        """
        with self._lock:
            thread, server = self._thread, self._server
            if thread is None or server is None or self._stopped:
                return
            self._stopped = True
        server.should_exit = True
        if thread is threading.current_thread():
            return
        thread.join(self._stop_timeout)
        if thread.is_alive():
            raise TimeoutError(f"read API on {self.url} did not stop within {self._stop_timeout} s")

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
