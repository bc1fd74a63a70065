"""The read API with authentication, over a real uvicorn server, a real store of several tenants and
real HTTP: 401 and 403, tenant isolation through every named query, the access log, metrics, a token
file changed while serving, TLS, and the reader's token."""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import json
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jwt
import psycopg
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID
from pydantic import BaseModel

from callgate.tokens import add_token, revoke_token
from consumers.access_log import AccessRecord, StoreAccessLog
from consumers.api import ApiServer, HealthStatus, build_app
from consumers.auth import JwtAuthenticator, TokenFile
from consumers.lake import lake_from_options
from consumers.metrics import MaterializerMetrics
from consumers.queries import QUERIES
from consumers.reader import AccessDeniedError, ApiReader, SourceUnavailableError
from consumers.runner import StoreQueryRunner
from consumers.store import AuditStore, RawRecord
from events import EventBase, MemorySink, encode_event
from interceptor_core import Block, Deny, Gate, RunContext, ToolBlockedError, ToolCall, tool

TOPIC = "callgate.audit"
TENANTS = ("acme", "globex", "initech")


class Order(BaseModel):
    order_id: str


@tool(description="Loads an order")
def get_order(args: Order) -> str:
    return f"order {args.order_id}"


@tool
def run_sql(query: str) -> str:
    """Runs SQL."""
    return "done"


class TenantOrders:
    name = "tenant-orders"

    def before_tool_call(self, call: ToolCall) -> Any:
        order = call.args.get("order_id")
        if order is not None and not order.startswith((call.run.tenant or "").upper() + "-"):
            return Deny(f"Order {order} is not {call.run.tenant}'s.")
        if "drop" in str(call.args.get("query", "")).lower():
            return Block("no DROP")
        return None


def workload() -> list[EventBase]:
    """Per tenant: allowed, denied and blocked calls in two runs; more of them for globex, so a
    leak would show in every count."""
    sink = MemorySink()
    gate = Gate("shop", interceptors=[TenantOrders()], sinks=[sink])
    desk = gate.workflow("support").agent("desk", tools=[get_order, run_sql])

    async def day() -> None:
        for n, tenant in enumerate(TENANTS):
            for run_no in range(2):
                run = RunContext(tenant=tenant, principal=f"{tenant}-user", run_id=f"run-{tenant}-{run_no}")
                for i in range(1 + n):
                    await desk.call("get_order", {"order_id": f"{tenant.upper()}-{i}"}, run=run)
                    await desk.call(
                        "get_order", {"order_id": f"OTHER-{i}"}, run=run, call_id=f"deny-{tenant}-{run_no}-{i}"
                    )
                with pytest.raises(ToolBlockedError):
                    await desk.call("run_sql", {"query": "DROP TABLE t"}, run=run)

    asyncio.run(day())
    return list(sink.events)


@dataclass
class Served:
    """A read API with a token file, over a store holding three tenants."""

    url: str
    store: AuditStore
    tokens_path: Path
    tokens: dict[str, str]
    events: list[EventBase]

    def client(self, who: str | None = None) -> httpx.Client:
        headers = {} if who is None else {"Authorization": f"Bearer {self.tokens[who]}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        con = self.store.cursor()
        try:
            return con.execute(query, list(params)).fetchall()
        finally:
            con.close()


ROLES = {
    "admin": ["admin"],
    "auditor": ["auditor"],
    "acme": ["tenant:acme"],
    "acme+globex": ["tenant:acme", "tenant:globex"],
}


def start_api(store: AuditStore, tokens_path: Path, **options: Any) -> ApiServer:
    app = build_app(
        StoreQueryRunner(store),
        MaterializerMetrics(),
        lambda: HealthStatus(ok=True, detail="test"),
        auth=TokenFile(tokens_path),
        access_log=options.pop("access_log", StoreAccessLog(store)),
        **options,
    )
    server = ApiServer(app)
    server.start()
    return server


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("auth_api")
    events = workload()
    store = AuditStore(tmp / "audit.duckdb")
    store.ingest(
        [RawRecord(TOPIC, 0, i, e.producer_id.encode(), encode_event(e)) for i, e in enumerate(events)],
        {(TOPIC, 0): len(events)},
    )
    tokens_path = tmp / "tokens.yaml"
    tokens = {who: add_token(tokens_path, f"{who}-subject", roles) for who, roles in ROLES.items()}
    server = start_api(store, tokens_path)
    try:
        yield Served(server.url, store, tokens_path, tokens, events)
    finally:
        server.stop()
        store.close()


class TestAuthentication:
    def test_healthz_needs_no_token(self, served: Served) -> None:
        """/healthz stays open."""
        with served.client() as client:
            assert client.get("/healthz").status_code == 200

    @pytest.mark.parametrize("path", ["/v1/queries", "/v1/queries/blocked_attempts", "/metrics"])
    def test_missing_token_is_401_with_a_bearer_challenge(self, served: Served, path: str) -> None:
        """No Authorization header: 401, a JSON error and WWW-Authenticate: Bearer."""
        with served.client() as client:
            response = client.get(path)
        assert response.status_code == 401
        assert response.headers["www-authenticate"].startswith("Bearer")
        assert "Authorization: Bearer" in response.json()["error"]

    @pytest.mark.parametrize("header", ["Bearer nope", "Bearer", "Basic YWxpY2U6cHc=", "nope"])
    def test_bad_token_is_401(self, served: Served, header: str) -> None:
        """An unknown token or another scheme: 401 with a JSON error."""
        with httpx.Client(base_url=served.url) as client:
            response = client.get("/v1/queries/blocked_attempts", headers={"Authorization": header})
        assert response.status_code == 401
        assert response.headers["www-authenticate"].startswith("Bearer")
        assert set(response.json()) == {"error"}

    def test_any_valid_token_lists_the_queries(self, served: Served) -> None:
        """The listing needs a token, of any role; each query says its scope."""
        with served.client("acme") as client:
            response = client.get("/v1/queries")
        assert response.status_code == 200
        listed = {q["name"]: q["scope"] for q in response.json()["queries"]}
        assert listed == {name: query.scope for name, query in QUERIES.items()}

    def test_a_role_that_does_not_allow_the_query_is_403(self, served: Served) -> None:
        """A tenant token asking a global query, or an auditor the access log: 403 with a JSON error."""
        with served.client("acme") as client:
            response = client.get("/v1/queries/chain_status")
        assert response.status_code == 403
        assert "admin or auditor" in response.json()["error"]
        with served.client("auditor") as client:
            response = client.get("/v1/queries/access_log")
        assert response.status_code == 403
        assert "admin" in response.json()["error"]

    def test_a_changed_token_file_is_picked_up_without_a_restart(self, served: Served) -> None:
        """A token added while serving works on the next request; revoked, it is refused on the next."""
        token = add_token(served.tokens_path, "late", ["auditor"])
        try:
            with httpx.Client(base_url=served.url, headers={"Authorization": f"Bearer {token}"}) as client:
                assert client.get("/v1/queries/chain_status").status_code == 200
                revoke_token(served.tokens_path, "late")
                assert client.get("/v1/queries/chain_status").status_code == 401
        finally:
            if "late" in TokenFile(served.tokens_path).subjects:
                revoke_token(served.tokens_path, "late")


class TestMetrics:
    def test_metrics_need_admin(self, served: Served) -> None:
        """/metrics: 403 for an auditor or a tenant, 200 for admin."""
        for who in ("auditor", "acme"):
            with served.client(who) as client:
                assert client.get("/metrics").status_code == 403
        with served.client("admin") as client:
            response = client.get("/metrics")
        assert response.status_code == 200
        assert "callgate_" in response.text

    def test_metrics_open(self, served: Served) -> None:
        """With metrics_open, /metrics answers without a token; the queries still need one."""
        server = start_api(served.store, served.tokens_path, metrics_open=True)
        try:
            with httpx.Client(base_url=server.url) as client:
                assert client.get("/metrics").status_code == 200
                assert client.get("/v1/queries/blocked_attempts").status_code == 401
        finally:
            server.stop()


# -- tenant isolation through every named query --------------------------------------------------


# Values for the parameters that pick one object, each of another tenant (globex): a query that
# ignored the token's tenant would return its rows.
def probes(served: Served) -> dict[str, str]:
    globex = [e for e in served.events if e.tenant == "globex" and e.call_id]
    return {
        "call_id": next(e.call_id for e in globex if e.call_id is not None),
        "run_id": globex[0].run_id or "",
        "event_id": globex[0].event_id,
        "principal": "globex-user",
    }


def check_rows_are_acme(served: Served, name: str, rows: list[dict[str, Any]]) -> None:
    """Every row that names a tenant, an event, a call or a run names acme's."""
    for row in rows:
        if "tenant" in row:
            assert row["tenant"] == "acme", (name, row)
        if name == "top_denied" and "key" in row:
            assert row["key"] != "globex", (name, row)
        for column in ("event_id", "call_id", "run_id"):
            if row.get(column):
                sql = f"SELECT DISTINCT tenant FROM events WHERE {column} = ?"  # noqa: S608 (a fixed column name)
                owners = {t for (t,) in served.sql(sql, row[column])}
                assert owners <= {"acme"}, (name, column, row)


class TestTenantIsolation:
    def test_every_named_query_keeps_a_tenant_token_to_its_tenant(self, served: Served) -> None:
        """For EVERY query in QUERIES, a tenant:acme token: global and admin queries are 403; tenant
        queries answer only acme's rows, with no parameters, with parameters naming globex's call,
        run or event, and grouped by tenant; asking for globex by tenant= is 403, and an empty
        tenant= is acme."""
        probe = probes(served)
        seen_rows = 0
        with served.client("acme") as client:
            for name, query in QUERIES.items():
                response = client.get(f"/v1/queries/{name}")
                if query.scope != "tenant":
                    assert response.status_code == 403, (name, response.text)
                    continue
                required = [p for p, spec in query.params.items() if spec.required]
                missing = [p for p in required if p not in probe]
                assert not missing, f"add a probe value for {missing} of {name} (another tenant's)"
                base = {p: probe[p] for p in required}
                attempts: list[dict[str, str]] = [base, {**base, "tenant": ""}]
                attempts.append({**base, **{k: v for k, v in probe.items() if k in query.params}})
                if "by" in query.params and "tenant" in (query.params["by"].choices or ()):
                    attempts.append({**base, "by": "tenant"})
                if "limit" in query.params:
                    attempts.append({**base, "limit": str(query.params["limit"].maximum)})
                for params in attempts:
                    response = client.get(f"/v1/queries/{name}", params=params)
                    assert response.status_code == 200, (name, params, response.text)
                    body = response.json()
                    assert body["params"]["tenant"] == "acme", (name, params)
                    check_rows_are_acme(served, name, body["rows"])
                    seen_rows += len(body["rows"])
                refused = client.get(f"/v1/queries/{name}", params={**base, "tenant": "globex"})
                assert refused.status_code == 403, (name, refused.text)
        assert seen_rows > 0

    def test_counts_equal_plain_sql_for_the_tenant(self, served: Served) -> None:
        """Count queries run by a tenant:acme token equal SQL counts over acme's events alone."""

        def count(sql: str) -> int:
            return int(served.sql(sql)[0][0])

        with served.client("acme") as client:

            def first(name: str, **params: str) -> dict[str, Any]:
                response = client.get(f"/v1/queries/{name}", params=params)
                assert response.status_code == 200, response.text
                return dict(response.json()["rows"][0])

            attempts = first("blocked_attempts_count")["attempts"]
            assert attempts == count("SELECT count(*) FROM blocked_attempts WHERE tenant = 'acme'") > 0
            events = sum(r["events"] for r in client.get("/v1/queries/event_counts").json()["rows"])
            assert events == count("SELECT count(*) FROM events WHERE tenant = 'acme'")
            overview = {r["metric"]: r["value"] for r in client.get("/v1/queries/overview_counts").json()["rows"]}
            outcomes = (
                "SELECT count(*) FROM events WHERE tenant = 'acme' AND type IN ('ToolUse', 'ToolDenied', 'Blocked')"
            )
            assert overview["calls"] == count(outcomes)
            runs = client.get("/v1/queries/runs").json()["rows"]
            assert sorted(r["run_id"] for r in runs) == ["run-acme-0", "run-acme-1"]
            replay = client.get("/v1/queries/replay_calls").json()["rows"]
            assert len(replay) == overview["calls"]

    def test_a_token_of_two_tenants_names_one(self, served: Served) -> None:
        """tenant:acme + tenant:globex: no tenant= is 400, globex's rows with tenant=globex, initech 403."""
        with served.client("acme+globex") as client:
            response = client.get("/v1/queries/blocked_attempts")
            assert response.status_code == 400
            assert "give tenant=" in response.json()["error"]
            rows = client.get("/v1/queries/blocked_attempts", params={"tenant": "globex"}).json()["rows"]
            assert rows
            assert {r["tenant"] for r in rows} == {"globex"}
            assert client.get("/v1/queries/blocked_attempts", params={"tenant": "initech"}).status_code == 403

    def test_auditor_reads_every_tenant(self, served: Served) -> None:
        """An auditor token sees all three tenants and the global queries."""
        with served.client("auditor") as client:
            rows = client.get("/v1/queries/blocked_attempts", params={"limit": "1000"}).json()["rows"]
            assert {r["tenant"] for r in rows} == set(TENANTS)
            assert client.get("/v1/queries/chain_status").status_code == 200


class TestAccessLog:
    def test_each_query_is_recorded_with_subject_params_rows(self, served: Served) -> None:
        """A tenant's query and its refused one leave rows: subject, query, params as run (tenant
        bound), status, row count; the admin reads them with the access_log query."""
        with served.client("acme") as client:
            rows = client.get("/v1/queries/blocked_attempts", params={"limit": "3"}).json()["rows"]
            assert client.get("/v1/queries/dead_letters").status_code == 403
        with served.client("admin") as client:
            response = client.get("/v1/queries/access_log", params={"subject": "acme-subject", "limit": "1000"})
        assert response.status_code == 200
        logged = response.json()["rows"]
        read = next(r for r in logged if r["query"] == "blocked_attempts" and r["params"].get("limit") == "3")
        assert read["status"] == 200
        assert read["row_count"] == len(rows) == 3
        assert read["params"]["tenant"] == "acme"
        assert read["roles"] == ["tenant:acme"]
        assert read["duration_ms"] >= 0
        refused = next(r for r in logged if r["query"] == "dead_letters")
        assert (refused["status"], refused["row_count"]) == (403, None)

    def test_a_failed_access_log_write_fails_the_request(self, served: Served) -> None:
        """When the record cannot be written, the answer is 500 and carries no rows."""

        class BrokenLog:
            def record(self, entry: AccessRecord) -> None:
                raise OSError("disk full")

        server = start_api(served.store, served.tokens_path, access_log=BrokenLog())
        try:
            with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {served.tokens['admin']}"}) as c:
                response = c.get("/v1/queries/blocked_attempts")
        finally:
            server.stop()
        assert response.status_code == 500
        assert "access log" in response.json()["error"]
        assert "rows" not in response.json()

    def test_healthz_is_503_while_the_access_log_cannot_be_written(self, served: Served, tmp_path: Path) -> None:
        """A store whose access_log table is gone (DuckDB refuses the insert): the read is 500 and
        /healthz turns 503 naming the access log; once a record is written again, 200."""
        store = AuditStore(tmp_path / "audit.duckdb")
        server = start_api(store, served.tokens_path)
        admin = {"Authorization": f"Bearer {served.tokens['admin']}"}
        try:
            with httpx.Client(base_url=server.url, headers=admin) as client:
                assert client.get("/healthz").status_code == 200
                store.cursor().execute("ALTER TABLE access_log RENAME TO access_log_away")
                assert client.get("/v1/queries/blocked_attempts").status_code == 500
                health = client.get("/healthz")
                assert health.status_code == 503
                assert health.json()["status"] == "unavailable"
                assert "access log cannot be written" in health.json()["detail"]
                store.cursor().execute("ALTER TABLE access_log_away RENAME TO access_log")
                assert client.get("/v1/queries/blocked_attempts").status_code == 200
                assert client.get("/healthz").status_code == 200
        finally:
            server.stop()
            store.close()


@dataclass
class ServedLake:
    """A read API over a lake over PostgreSQL: the workload up to acme's second run stored before
    `between`, the rest after."""

    served: Served
    between: dt.datetime
    before: list[EventBase]


@pytest.fixture(scope="module")
def served_lake(tmp_path_factory: pytest.TempPathFactory, postgres_dsn: str) -> Iterator[ServedLake]:
    tmp = tmp_path_factory.mktemp("auth_api_lake")
    database = "lake_auth_api"
    with psycopg.connect(postgres_dsn, autocommit=True) as con:
        con.execute(f'CREATE DATABASE "{database}"')
    lake = lake_from_options(f"postgres:{postgres_dsn.replace('dbname=postgres', f'dbname={database}')}", str(tmp))
    events = workload()
    wire = [RawRecord(TOPIC, 0, i, e.producer_id.encode(), encode_event(e)) for i, e in enumerate(events)]
    half = next(i for i, e in enumerate(events) if getattr(e, "run_id", None) == "run-acme-1")
    store = AuditStore(lake)
    store.ingest(wire[:half], {(TOPIC, 0): half})
    between = dt.datetime.now(dt.UTC)
    store.ingest(wire[half:], {(TOPIC, 0): len(events)})
    tokens_path = tmp / "tokens.yaml"
    tokens = {who: add_token(tokens_path, f"{who}-subject", roles) for who, roles in ROLES.items()}
    server = start_api(store, tokens_path)
    try:
        yield ServedLake(Served(server.url, store, tokens_path, tokens, events), between, events[:half])
    finally:
        server.stop()
        store.close()


class TestTimeTravel:
    def test_as_of_answers_as_the_lake_was_within_the_tokens_tenant(self, served_lake: ServedLake) -> None:
        """?as_of=T leaves out what was stored after T; a tenant token still reads its own tenant only,
        and is refused another's as of T as now."""
        served, between = served_lake.served, served_lake.between.isoformat()
        denied_then = sorted(
            e.event_id
            for e in served_lake.before
            if e.type == "ToolDenied" and e.tenant == "acme"  # type: ignore[attr-defined]
        )
        with served.client("acme") as client:
            then = client.get("/v1/queries/blocked_attempts", params={"as_of": between, "limit": "1000"})
            now = client.get("/v1/queries/blocked_attempts", params={"limit": "1000"})
            other = client.get("/v1/queries/blocked_attempts", params={"as_of": between, "tenant": "globex"})
        assert then.status_code == now.status_code == 200
        assert then.json()["params"]["as_of"] == between
        then_rows = then.json()["rows"]
        assert {r["tenant"] for r in then_rows} == {"acme"}
        assert sorted(r["event_id"] for r in then_rows if r["type"] == "ToolDenied") == denied_then
        assert len(then_rows) < len(now.json()["rows"])
        assert other.status_code == 403

    @pytest.mark.parametrize(
        ("value", "words"),
        [("2999-01-01T00:00:00Z", "not after now"), ("last tuesday", "a snapshot id or an ISO 8601 date-time")],
    )
    def test_a_malformed_or_future_as_of_is_400_naming_it(
        self, served_lake: ServedLake, value: str, words: str
    ) -> None:
        """A value that is no time or snapshot id, and a time after now: 400, the error names as_of."""
        with served_lake.served.client("auditor") as client:
            response = client.get("/v1/queries/event_counts", params={"as_of": value})
        assert response.status_code == 400
        assert "'as_of'" in response.json()["error"]
        assert words in response.json()["error"]

    def test_a_time_travelled_read_is_in_the_access_log(self, served_lake: ServedLake) -> None:
        """The access log records the read with its as_of, as it records every parameter."""
        served, between = served_lake.served, served_lake.between.isoformat()
        with served.client("acme") as client:
            assert client.get("/v1/queries/event_counts", params={"as_of": between}).status_code == 200
        with served.client("admin") as client:
            logged = client.get("/v1/queries/access_log", params={"subject": "acme-subject", "limit": "1000"})
        read = next(r for r in logged.json()["rows"] if r["query"] == "event_counts")
        assert (read["status"], read["params"]["as_of"], read["params"]["tenant"]) == (200, between, "acme")

    def test_as_of_on_a_file_is_400_saying_it_keeps_no_snapshots(self, served: Served) -> None:
        """The file home refuses as_of with a 400 that names the parameter and says why."""
        with served.client("auditor") as client:
            response = client.get("/v1/queries/event_counts", params={"as_of": "2026-01-01T00:00:00Z"})
        assert response.status_code == 400
        assert "'as_of'" in response.json()["error"]
        assert "keeps no snapshots" in response.json()["error"]


class TestApiReaderToken:
    def test_the_reader_sends_its_token(self, served: Served) -> None:
        """ApiReader(url, token=...) reads what its token may read."""
        rows = ApiReader(served.url, token=served.tokens["acme"]).query("blocked_attempts").rows
        assert {r["tenant"] for r in rows} == {"acme"}

    def test_401_and_403_are_access_denied(self, served: Served) -> None:
        """No token: AccessDeniedError 401 saying to give --token; a forbidden query: 403 naming it."""
        with pytest.raises(AccessDeniedError, match="--token or CALLGATE_TOKEN") as missing:
            ApiReader(served.url).query("blocked_attempts")
        assert missing.value.status == 401
        assert isinstance(missing.value, SourceUnavailableError)
        with pytest.raises(AccessDeniedError, match="refused query 'chain_status'") as forbidden:
            ApiReader(served.url, token=served.tokens["acme"]).query("chain_status")
        assert forbidden.value.status == 403

    def test_the_token_is_not_in_the_repr(self, served: Served) -> None:
        """A reader printed in a log does not show its token."""
        assert served.tokens["acme"] not in repr(ApiReader(served.url, token=served.tokens["acme"]))


class TestJwtOverHttp:
    def test_oidc_tokens_are_checked_and_scoped(self, served: Served, tmp_path: Path) -> None:
        """A read API with --jwt-*: a JWT of our issuer with role tenant:globex reads globex's rows only,
        its sub is the subject in the access log; an expired one is 401."""
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        jwk = jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key(), as_dict=True)
        jwks = tmp_path / "jwks.json"
        jwks.write_text(json.dumps({"keys": [{**jwk, "kid": "k1", "alg": "RS256", "use": "sig"}]}))
        issuer, audience = "https://idp.test", "callgate"

        def sign(**claims: Any) -> str:
            now = int(time.time())
            body = {"sub": "erin@globex", "iss": issuer, "aud": audience, "exp": now + 60, "roles": ["tenant:globex"]}
            return jwt.encode({**body, **claims}, key, algorithm="RS256", headers={"kid": "k1"})

        app = build_app(
            StoreQueryRunner(served.store),
            MaterializerMetrics(),
            lambda: HealthStatus(ok=True),
            auth=JwtAuthenticator(str(jwks), audience=audience, issuer=issuer),
            access_log=StoreAccessLog(served.store),
        )
        with ApiServer(app) as server, httpx.Client(base_url=server.url) as client:
            good = client.get("/v1/queries/blocked_attempts", headers={"Authorization": f"Bearer {sign()}"})
            assert good.status_code == 200
            assert {r["tenant"] for r in good.json()["rows"]} == {"globex"}
            expired = client.get(
                "/v1/queries/blocked_attempts",
                headers={"Authorization": f"Bearer {sign(exp=int(time.time()) - 3600)}"},
            )
            assert expired.status_code == 401
            assert "expired" in expired.json()["error"]
        logged = served.sql("SELECT count(*) FROM access_log WHERE subject = 'erin@globex' AND status = 200")
        assert logged == [(1,)]


# -- TLS ----------------------------------------------------------------------------------------


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost, signed by its own EC key (PEM files)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "callgate test")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "api.crt", directory / "api.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


class TestTls:
    def test_serves_https_to_a_client_that_trusts_the_certificate(self, served: Served, tmp_path: Path) -> None:
        """With a certificate and key the API answers HTTPS (and the URL says https); httpx and
        ApiReader trusting the certificate read through it; one that does not trust it cannot."""
        cert, key = self_signed(tmp_path)
        app = build_app(
            StoreQueryRunner(served.store),
            MaterializerMetrics(),
            lambda: HealthStatus(ok=True),
            auth=TokenFile(served.tokens_path),
            access_log=StoreAccessLog(served.store),
        )
        with ApiServer(app, ssl_certfile=str(cert), ssl_keyfile=str(key)) as server:
            assert server.url.startswith("https://127.0.0.1:")
            trust = ssl.create_default_context(cafile=str(cert))
            headers = {"Authorization": f"Bearer {served.tokens['acme']}"}
            with httpx.Client(base_url=server.url, verify=trust, headers=headers) as client:
                response = client.get("/v1/queries/blocked_attempts")
            assert response.status_code == 200
            assert {r["tenant"] for r in response.json()["rows"]} == {"acme"}
            reader = ApiReader(server.url, token=served.tokens["acme"], ssl_context=trust)
            assert reader.query("blocked_attempts").rows
            with pytest.raises(SourceUnavailableError, match="cannot reach"):
                ApiReader(server.url, token=served.tokens["acme"]).query("blocked_attempts")
            with pytest.raises(httpx.HTTPError):
                httpx.get(server.url.replace("https", "http") + "/healthz")

    def test_a_bad_certificate_raises_from_start(self, tmp_path: Path) -> None:
        """A certificate file that is not one fails in start(), in the caller."""
        (tmp_path / "bad.crt").write_text("not a certificate")
        (tmp_path / "bad.key").write_text("not a key")
        server = ApiServer(
            build_app(StoreQueryRunner.__new__(StoreQueryRunner), MaterializerMetrics(), lambda: HealthStatus(ok=True)),
            ssl_certfile=str(tmp_path / "bad.crt"),
            ssl_keyfile=str(tmp_path / "bad.key"),
        )
        with pytest.raises(ssl.SSLError):
            server.start()
        server.stop()
