"""The materializer's read API (routes, the uvicorn server in a thread) and its Prometheus metrics."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import duckdb
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette

from consumers.api import ApiServer, HealthStatus, PartitionHealth, QueryRunner, build_app
from consumers.metrics import CHAIN_BREAK_KINDS, DEAD_LETTER_REASONS, MaterializerMetrics

# --- the test's QueryRunner: named queries over an in-memory DuckDB table ---------------------------


class BadParameter(ValueError):
    """Raised for a missing, unknown or malformed parameter, as consumers.queries raises QueryError."""


@dataclass(frozen=True)
class Param:
    name: str
    type: str  # "str" | "int" | "timestamp"
    default: str | None  # None: required


@dataclass(frozen=True)
class Query:
    description: str
    params: tuple[Param, ...]
    sql: str


QUERIES = {
    "events_by_tenant": Query(
        "Events of one tenant, oldest first.",
        (Param("tenant", "str", None), Param("limit", "int", "10")),
        "SELECT event_id, type, tenant, time FROM events WHERE tenant = $tenant ORDER BY time LIMIT $limit",
    ),
    "type_counts": Query(
        "Events per type since a moment.",
        (Param("since", "timestamp", "1970-01-01T00:00:00"),),
        "SELECT type, count(*) AS n FROM events WHERE time >= $since GROUP BY type ORDER BY type",
    ),
    "odd_values": Query(
        "Values JSON cannot carry as they are: a NaN and an infinity.",
        (),
        "SELECT 'NaN'::DOUBLE AS ratio, 'inf'::DOUBLE AS ceiling, 1.5::DOUBLE AS plain",
    ),
    "broken": Query("Reads a table that does not exist.", (), "SELECT * FROM no_such_table"),
}


class DuckRunner:
    """A `QueryRunner` over an in-memory DuckDB database: one cursor per call, so threads may share it.

    Rows are returned as DuckDB gives them (datetimes included), which also exercises the API's lenient
    JSON encoding. `before_run(name)`, if given, runs in the worker thread before each query.
    """

    def __init__(self, before_run: Callable[[str], object] | None = None) -> None:
        self.before_run = before_run
        self._db = duckdb.connect()
        self._db.execute(
            "CREATE TABLE events (event_id VARCHAR PRIMARY KEY, type VARCHAR, tenant VARCHAR, time TIMESTAMP)"
        )
        self._db.executemany(
            "INSERT INTO events VALUES (?, ?, ?, ?)",
            [
                ["e1", "ToolUse", "acme", datetime(2024, 5, 1, 10, 0)],
                ["e2", "ToolDenied", "acme", datetime(2024, 5, 1, 11, 0)],
                ["e3", "ToolUse", "globex", datetime(2024, 5, 2, 9, 0)],
                ["e4", "ToolUse", "acme", datetime(2024, 5, 3, 8, 0)],
            ],
        )

    def names(self) -> list[dict[str, Any]]:
        return [
            {
                "name": name,
                "description": query.description,
                "parameters": [{"name": p.name, "type": p.type, "default": p.default} for p in query.params],
            }
            for name, query in QUERIES.items()
        ]

    def run(self, name: str, params: Mapping[str, str]) -> dict[str, Any]:
        query = QUERIES[name]
        known = {p.name for p in query.params}
        for given in params:
            if given not in known:
                raise BadParameter(f"unknown parameter {given!r} for query {name!r}")
        values = {p.name: self._convert(p, params.get(p.name, p.default)) for p in query.params}
        if self.before_run is not None:
            self.before_run(name)
        cursor = self._db.cursor()
        try:
            cursor.execute(query.sql, values)
            columns = [column[0] for column in cursor.description or []]
            rows = [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
        finally:
            cursor.close()
        return {"columns": columns, "rows": rows}

    @staticmethod
    def _convert(param: Param, value: str | None) -> object:
        if value is None:
            raise BadParameter(f"parameter {param.name!r} is required")
        try:
            if param.type == "int":
                return int(value)
            if param.type == "timestamp":
                return datetime.fromisoformat(value)
        except ValueError:
            raise BadParameter(f"parameter {param.name!r} must be a {param.type}, got {value!r}") from None
        return value


class Health:
    """A health callable whose answer the test sets."""

    def __init__(self) -> None:
        self.status = HealthStatus(ok=True, detail="consuming")

    def __call__(self) -> HealthStatus:
        return self.status


def make_app(
    runner: QueryRunner | None = None, metrics: MaterializerMetrics | None = None, health: Health | None = None
) -> Starlette:
    return build_app(runner or DuckRunner(), metrics or MaterializerMetrics(), health or Health())


@asynccontextmanager
async def asgi_client(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client calling the app in-process (starlette's TestClient wants httpx2, which is not installed)."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as client:
        yield client


async def call(
    app: Starlette, path: str, *, method: str = "GET", params: Mapping[str, str] | None = None
) -> httpx.Response:
    async with asgi_client(app) as client:
        return await client.request(method, path, params=params)


def port_accepts(address: tuple[str, int]) -> bool:
    try:
        with socket.create_connection(address, timeout=2):
            return True
    except OSError:
        return False


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Parsed Prometheus text: (sample name, sorted labels) -> value."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def one_batch(metrics: MaterializerMetrics, **overrides: Any) -> None:
    arguments: dict[str, Any] = {
        "stored_by_type": {"ToolUse": 3, "ToolDenied": 1},
        "duplicates": 2,
        "dead_letters_by_reason": {"invalid_json": 1},
        "chain_breaks_by_kind": {"gap": 1},
        "seconds": 0.02,
        "records": 7,
        "last_event_time": datetime(2024, 5, 1, 12, 0, tzinfo=UTC),
    }
    arguments.update(overrides)
    metrics.record_batch(**arguments)


# --- MaterializerMetrics ------------------------------------------------------------------------------


class TestMaterializerMetrics:
    def test_record_batch_counts_by_label(self) -> None:
        """record_batch adds stored events by type, duplicates, dead letters by reason and chain breaks by kind."""
        metrics = MaterializerMetrics()
        one_batch(metrics)
        one_batch(metrics, stored_by_type={"ToolUse": 1}, duplicates=0)
        value = metrics.registry.get_sample_value
        assert value("callgate_events_stored_total", {"type": "ToolUse"}) == 4
        assert value("callgate_events_stored_total", {"type": "ToolDenied"}) == 1
        assert value("callgate_events_duplicate_total") == 2
        assert value("callgate_dead_letters_total", {"reason": "invalid_json"}) == 2
        assert value("callgate_chain_breaks_total", {"kind": "gap"}) == 2
        assert value("callgate_batch_seconds_count") == 2
        assert value("callgate_batch_seconds_sum") == pytest.approx(0.04)
        assert value("callgate_batch_records_sum") == 14

    def test_known_labels_start_at_zero(self) -> None:
        """Every event type, dead-letter reason and chain-break kind is exported at 0 before anything happens."""
        value = MaterializerMetrics().registry.get_sample_value
        assert value("callgate_events_stored_total", {"type": "ToolsRegistered"}) == 0
        for reason in DEAD_LETTER_REASONS:
            assert value("callgate_dead_letters_total", {"reason": reason}) == 0
        for kind in CHAIN_BREAK_KINDS:
            assert value("callgate_chain_breaks_total", {"kind": kind}) == 0

    def test_instances_do_not_share_a_registry(self) -> None:
        """Two instances live in one process and count separately."""
        first, second = MaterializerMetrics(), MaterializerMetrics()
        one_batch(first)
        assert first.registry.get_sample_value("callgate_events_duplicate_total") == 2
        assert second.registry.get_sample_value("callgate_events_duplicate_total") == 0

    def test_negative_count_raises_and_records_nothing(self) -> None:
        """A negative count raises ValueError before any metric moves."""
        metrics = MaterializerMetrics()
        with pytest.raises(ValueError, match="must not be negative"):
            one_batch(metrics, chain_breaks_by_kind={"tamper": -1})
        assert metrics.registry.get_sample_value("callgate_events_stored_total", {"type": "ToolUse"}) == 0
        assert metrics.registry.get_sample_value("callgate_batch_seconds_count") == 0
        assert metrics.last_batch_at is None

    def test_last_event_time_only_moves_forward(self) -> None:
        """The last-event gauge keeps the newest time seen; a naive datetime is taken as UTC."""
        metrics = MaterializerMetrics()
        newest = datetime(2024, 5, 2, tzinfo=UTC)
        one_batch(metrics, last_event_time=newest)
        one_batch(metrics, last_event_time=datetime(2024, 5, 1, tzinfo=UTC))
        one_batch(metrics, last_event_time=None)
        assert metrics.registry.get_sample_value("callgate_last_event_timestamp_seconds") == newest.timestamp()
        one_batch(metrics, last_event_time=datetime(2024, 5, 3))
        assert metrics.last_event_at == datetime(2024, 5, 3, tzinfo=UTC)
        assert metrics.last_batch_at is not None

    def test_lag_per_partition(self) -> None:
        """set_lag sets one gauge per topic and partition, clamps below zero, and remove_lag drops the series."""
        metrics = MaterializerMetrics()
        metrics.set_lag("audit", 0, 5)
        metrics.set_lag("audit", 1, 7)
        metrics.set_lag("audit", 2, -3)
        value = metrics.registry.get_sample_value
        assert value("callgate_consumer_lag", {"topic": "audit", "partition": "1"}) == 7
        assert value("callgate_consumer_lag", {"topic": "audit", "partition": "2"}) == 0
        assert metrics.lag_total() == 12
        metrics.remove_lag("audit", 1)
        metrics.remove_lag("audit", 9)
        assert value("callgate_consumer_lag", {"topic": "audit", "partition": "1"}) is None
        assert metrics.lag_total() == 5

    def test_partition_series(self) -> None:
        """set_partition publishes owned, position, high watermark and unread seconds; remove_partition drops them."""
        metrics = MaterializerMetrics()
        metrics.set_lag("audit", 1, 3)
        metrics.set_partition("audit", 0, owned=True, position=5, high_watermark=9, unread_s=0.0)
        metrics.set_partition("audit", 1, owned=False, position=None, high_watermark=4, unread_s=12.0)
        value = metrics.registry.get_sample_value
        zero, one = {"topic": "audit", "partition": "0"}, {"topic": "audit", "partition": "1"}
        assert (value("callgate_partition_owned", zero), value("callgate_partition_owned", one)) == (1, 0)
        assert value("callgate_partition_position", zero) == 5
        assert value("callgate_partition_position", one) is None
        assert value("callgate_partition_high_watermark", one) == 4
        assert value("callgate_partition_unread_seconds", one) == 12
        assert value("callgate_consumer_lag", one) is None  # not read here: no consumer position to lag
        metrics.remove_partition("audit", 0)
        metrics.remove_partition("audit", 9)
        assert value("callgate_partition_owned", zero) is None
        assert value("callgate_partition_high_watermark", zero) is None

    def test_render_is_prometheus_text(self) -> None:
        """render returns the text exposition, parseable, with its content type."""
        metrics = MaterializerMetrics()
        one_batch(metrics)
        body, content_type = metrics.render()
        assert content_type.startswith("text/plain")
        parsed = samples(body.decode())
        assert parsed[("callgate_events_stored_total", (("type", "ToolUse"),))] == 3

    def test_recording_from_threads_loses_nothing(self) -> None:
        """Batches recorded from eight threads at once all count."""
        metrics = MaterializerMetrics()

        def work() -> None:
            for _ in range(500):
                metrics.record_batch({"ToolUse": 1}, 0, {}, {}, 0.001, 1, None)

        threads = [threading.Thread(target=work) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert metrics.registry.get_sample_value("callgate_events_stored_total", {"type": "ToolUse"}) == 4000
        assert metrics.registry.get_sample_value("callgate_batch_records_count") == 4000


# --- HealthStatus -------------------------------------------------------------------------------------


class TestHealthStatus:
    def test_json_shape(self) -> None:
        """to_json reports status ok/unavailable, the detail, ISO datetimes and the lag."""
        at = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
        assert HealthStatus(ok=True, last_batch_at=at, lag_total=3).to_json() == {
            "status": "ok",
            "detail": "",
            "last_batch_at": "2024-05-01T12:00:00+00:00",
            "last_event_at": None,
            "lag_total": 3,
            "topic": None,
            "partitions": [],
        }
        assert HealthStatus(ok=False, detail="consumer loop died").to_json()["status"] == "unavailable"

    def test_json_lists_every_partition(self) -> None:
        """Each partition the broker lists appears with ownership, position, high watermark, lag and unread time."""
        status = HealthStatus(
            ok=False,
            topic="audit",
            partitions=(
                PartitionHealth(0, owned=True, position=7, high_watermark=7, lag=0),
                PartitionHealth(1, owned=False, high_watermark=4, lag=4, unread_s=12.5),
            ),
        )
        body = status.to_json()
        assert body["topic"] == "audit"
        assert body["partitions"] == [
            {"partition": 0, "owned": True, "position": 7, "high_watermark": 7, "lag": 0, "unread_s": 0.0},
            {"partition": 1, "owned": False, "position": None, "high_watermark": 4, "lag": 4, "unread_s": 12.5},
        ]


# --- the routes ---------------------------------------------------------------------------------------


class TestBuildApp:
    async def test_healthz_ok(self) -> None:
        """GET /healthz answers 200 with status ok and the health fields."""
        app = make_app()
        response = await call(app, "/healthz")
        assert response.status_code == 200
        assert response.json()["status"] == "ok"
        assert response.json()["detail"] == "consuming"

    async def test_healthz_unavailable(self) -> None:
        """GET /healthz answers 503 with the detail when the health callable says not ok."""
        health = Health()
        app = make_app(health=health)
        health.status = HealthStatus(ok=False, detail="consumer loop died: KafkaError")
        response = await call(app, "/healthz")
        assert response.status_code == 503
        assert response.json()["status"] == "unavailable"
        assert response.json()["detail"] == "consumer loop died: KafkaError"

    async def test_healthz_when_the_check_raises(self, caplog: pytest.LogCaptureFixture) -> None:
        """A health callable that raises makes /healthz answer 503 and logs the traceback."""

        def failing() -> HealthStatus:
            raise RuntimeError("lock poisoned")

        app = build_app(DuckRunner(), MaterializerMetrics(), failing)
        with caplog.at_level(logging.ERROR, logger="consumers.api"):
            response = await call(app, "/healthz")
        assert response.status_code == 503
        assert "lock poisoned" not in response.text
        assert any(record.exc_info for record in caplog.records)

    async def test_metrics_after_record_batch_and_set_lag(self) -> None:
        """GET /metrics serves the Prometheus text with every metric name and the recorded values."""
        metrics = MaterializerMetrics()
        one_batch(metrics)
        metrics.set_lag("audit", 0, 42)
        response = await call(make_app(metrics=metrics), "/metrics")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain")
        for name in (
            "callgate_events_stored_total",
            "callgate_events_duplicate_total",
            "callgate_dead_letters_total",
            "callgate_chain_breaks_total",
            "callgate_consumer_lag",
            "callgate_batch_seconds",
            "callgate_batch_records",
            "callgate_last_event_timestamp_seconds",
        ):
            assert name in response.text
        parsed = samples(response.text)
        assert parsed[("callgate_consumer_lag", (("partition", "0"), ("topic", "audit")))] == 42
        assert parsed[("callgate_dead_letters_total", (("reason", "invalid_json"),))] == 1

    async def test_list_queries(self) -> None:
        """GET /v1/queries lists every named query with its parameters, types and defaults."""
        response = await call(make_app(), "/v1/queries")
        assert response.status_code == 200
        queries = {query["name"]: query for query in response.json()["queries"]}
        assert set(queries) == set(QUERIES)
        assert queries["events_by_tenant"]["parameters"] == [
            {"name": "tenant", "type": "str", "default": None},
            {"name": "limit", "type": "int", "default": "10"},
        ]

    async def test_query_with_parameters(self) -> None:
        """GET /v1/queries/{name} passes the query string to the runner and returns its columns and rows."""
        app = make_app()
        response = await call(app, "/v1/queries/events_by_tenant", params={"tenant": "acme", "limit": "2"})
        assert response.status_code == 200
        assert response.json()["columns"] == ["event_id", "type", "tenant", "time"]
        assert [row["event_id"] for row in response.json()["rows"]] == ["e1", "e2"]
        counts = (await call(app, "/v1/queries/type_counts", params={"since": "2024-05-02T00:00:00"})).json()
        assert counts["rows"] == [{"type": "ToolUse", "n": 2}]

    async def test_values_json_cannot_carry(self) -> None:
        """Datetimes become strings and NaN or infinity become null instead of failing the response."""
        app = make_app()
        row = (await call(app, "/v1/queries/events_by_tenant", params={"tenant": "globex"})).json()["rows"][0]
        assert row["time"] == str(datetime(2024, 5, 2, 9, 0))
        odd = await call(app, "/v1/queries/odd_values")
        assert odd.status_code == 200
        assert odd.json()["rows"] == [{"ratio": None, "ceiling": None, "plain": 1.5}]

    async def test_unknown_query_is_404(self) -> None:
        """An unknown query name answers 404 with an error naming it."""
        response = await call(make_app(), "/v1/queries/no_such_query")
        assert response.status_code == 404
        assert "no_such_query" in response.json()["error"]

    async def test_unknown_path_is_404_json(self) -> None:
        """A path no route matches answers 404 with a JSON error body."""
        response = await call(make_app(), "/v2/anything")
        assert response.status_code == 404
        assert "error" in response.json()

    @pytest.mark.parametrize(
        ("params", "named"),
        [
            ({"tenant": "acme", "limit": "many"}, "limit"),
            ({"limit": "3"}, "tenant"),
            ({"tenant": "acme", "colour": "red"}, "colour"),
        ],
    )
    async def test_bad_parameter_is_400_naming_it(self, params: dict[str, str], named: str) -> None:
        """A malformed, missing or unknown parameter answers 400 with an error that names the parameter."""
        response = await call(make_app(), "/v1/queries/events_by_tenant", params=params)
        assert response.status_code == 400
        assert repr(named) in response.json()["error"]

    async def test_repeated_parameter_is_400(self) -> None:
        """A parameter given twice answers 400 naming it, since the runner takes one string per name."""
        response = await call(make_app(), "/v1/queries/events_by_tenant?tenant=acme&tenant=globex")
        assert response.status_code == 400
        assert "'tenant'" in response.json()["error"]

    async def test_runner_exception_is_500_without_its_message(self, caplog: pytest.LogCaptureFixture) -> None:
        """An exception from the runner answers 500 "internal error" and logs the traceback instead of returning it."""
        app = make_app()
        with caplog.at_level(logging.ERROR, logger="consumers.api"):
            response = await call(app, "/v1/queries/broken")
        assert response.status_code == 500
        assert response.json() == {"error": "internal error"}
        [record] = [r for r in caplog.records if r.exc_info]
        assert isinstance(record.exc_info[1], duckdb.CatalogException)  # type: ignore[index]
        assert "no_such_table" in caplog.text
        assert "no_such_table" not in response.text

    async def test_key_error_inside_a_known_query_is_500(self, caplog: pytest.LogCaptureFixture) -> None:
        """A KeyError raised while running a known query is a bug in it (500), not an unknown name (404)."""

        def missing_column(name: str) -> None:
            raise KeyError("amount_cents")

        app = make_app(runner=DuckRunner(before_run=missing_column))
        with caplog.at_level(logging.ERROR, logger="consumers.api"):
            response = await call(app, "/v1/queries/type_counts")
        assert response.status_code == 500
        assert response.json() == {"error": "internal error"}
        assert "amount_cents" in caplog.text

    @pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
    async def test_other_methods_are_405(self, method: str) -> None:
        """Any method but GET answers 405 with a JSON error and an Allow header."""
        app = make_app()
        for path in ("/healthz", "/metrics", "/v1/queries", "/v1/queries/type_counts"):
            response = await call(app, path, method=method)
            assert response.status_code == 405
            assert "error" in response.json()
            assert "GET" in response.headers["allow"]

    async def test_ten_concurrent_queries_run_in_threads(self) -> None:
        """Ten requests at once are all answered, each query running in its own worker thread at the same time."""
        # Each query waits until all ten are inside the runner: that only happens if none blocks the loop.
        barrier = threading.Barrier(10)
        app = make_app(runner=DuckRunner(before_run=lambda name: barrier.wait(timeout=10)))
        async with asgi_client(app) as client:
            responses = await asyncio.gather(
                *(
                    client.get("/v1/queries/events_by_tenant", params={"tenant": "acme", "limit": "1"})
                    for _ in range(10)
                )
            )
        assert [r.status_code for r in responses] == [200] * 10
        assert all(r.json()["rows"][0]["event_id"] == "e1" for r in responses)


# --- ApiServer ----------------------------------------------------------------------------------------


@pytest.fixture
def served() -> Iterator[ApiServer]:
    """A real uvicorn server on a free loopback port, stopped afterwards."""
    with ApiServer(make_app(), port=0) as server:
        yield server


class TestApiServer:
    def test_serves_real_http_and_closes_the_port_on_stop(self) -> None:
        """start() serves on a free loopback port over real HTTP; stop() closes the port and may be repeated."""
        server = ApiServer(make_app(), port=0)
        server.start()
        host, port = server.address
        assert host == "127.0.0.1"
        assert port > 0
        assert server.url == f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=server.url, timeout=5) as client:
            assert client.get("/healthz").json()["status"] == "ok"
            rows = client.get("/v1/queries/events_by_tenant", params={"tenant": "globex"}).json()["rows"]
            assert [row["event_id"] for row in rows] == ["e3"]
            assert client.get("/v1/queries/nope").status_code == 404
        server.stop()
        assert not port_accepts((host, port))
        server.stop()

    async def test_ten_concurrent_requests_over_http(self, served: ApiServer) -> None:
        """Ten requests sent at once over real HTTP are all answered."""
        async with httpx.AsyncClient(base_url=served.url, timeout=10) as client:
            responses = await asyncio.gather(
                *(client.get("/v1/queries/type_counts", params={"since": f"2024-05-0{1 + i % 3}"}) for i in range(10))
            )
        assert [r.status_code for r in responses] == [200] * 10

    def test_context_manager_starts_and_stops(self) -> None:
        """Used as a context manager, the server serves inside the block and the port is closed after it."""
        with ApiServer(make_app()) as server:
            address = server.address
            assert port_accepts(address)
        assert not port_accepts(address)

    def test_port_in_use_raises_in_the_caller(self) -> None:
        """start() on a port another socket holds raises OSError in the calling thread."""
        with socket.create_server(("127.0.0.1", 0)) as holder:
            server = ApiServer(make_app(), port=holder.getsockname()[1])
            with pytest.raises(OSError):  # noqa: PT011 - the errno differs by platform
                server.start()
            server.stop()

    def test_start_twice_raises(self, served: ApiServer) -> None:
        """A server runs once: a second start() raises RuntimeError."""
        with pytest.raises(RuntimeError, match="only once"):
            served.start()

    def test_address_before_start_raises(self) -> None:
        """address has no value before start() and says so with RuntimeError."""
        with pytest.raises(RuntimeError, match="not been started"):
            _ = ApiServer(make_app()).address
