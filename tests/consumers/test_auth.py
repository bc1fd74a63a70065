"""consumers.auth: roles, scope_params, the token file and OIDC bearer tokens (JWTs with a real key)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from consumers.auth import (
    ANONYMOUS,
    AuthenticatorChain,
    AuthError,
    ConfigError,
    Forbidden,
    Identity,
    JwtAuthenticator,
    TokenFile,
    hash_token,
    parse_role,
    parse_token_file,
    scope_params,
)
from consumers.queries import QUERIES, NamedQuery, Param, QueryError, UnknownQueryError

ACME = Identity("acme-admin", frozenset({"tenant:acme"}))
TWO = Identity("both", frozenset({"tenant:acme", "tenant:globex"}))
AUDITOR = Identity("carol", frozenset({"auditor"}))
ADMIN = Identity("root", frozenset({"admin"}))
NOBODY = Identity("guest", frozenset({"viewer"}))


class TestIdentity:
    def test_properties(self) -> None:
        """admin, all_tenants and tenants read the roles."""
        assert (ADMIN.admin, ADMIN.all_tenants, ADMIN.tenants) == (True, True, frozenset())
        assert (AUDITOR.admin, AUDITOR.all_tenants) == (False, True)
        assert (ACME.admin, ACME.all_tenants, ACME.tenants) == (False, False, {"acme"})
        assert TWO.tenants == {"acme", "globex"}
        assert ANONYMOUS.admin

    @pytest.mark.parametrize("role", ["admin", "auditor", "tenant:acme", "tenant:a b"])
    def test_known_roles(self, role: str) -> None:
        """admin, auditor and tenant:<id> are roles."""
        assert parse_role(role) == role

    @pytest.mark.parametrize("role", ["root", "tenant:", "tenant: acme", "tenant:acme\n", "Admin", ""])
    def test_unknown_roles_are_refused(self, role: str) -> None:
        """Anything else, an empty or padded tenant id included, is a ValueError naming it."""
        with pytest.raises(ValueError, match="unknown role"):
            parse_role(role)


class TestQueryScopes:
    def test_every_query_declares_a_scope(self) -> None:
        """Every named query says who may read it; a tenant query has a $tenant filter and parameter."""
        for name, query in QUERIES.items():
            assert query.scope in ("tenant", "global", "admin"), name
            if query.scope == "tenant":
                assert "tenant" in query.params, name
                assert "$tenant" in query.sql, name

    def test_a_query_cannot_be_made_without_a_scope(self) -> None:
        """The scope is a constructor argument without a default."""
        with pytest.raises(TypeError, match="scope"):
            NamedQuery("q", "d", "SELECT 1", {})  # type: ignore[call-arg]

    def test_a_tenant_query_without_a_tenant_filter_is_refused(self) -> None:
        """Declaring "tenant" on SQL that filters no tenant raises when the query is built."""
        with pytest.raises(ValueError, match="no \\$tenant"):
            NamedQuery("q", "d", "SELECT 1", {"tenant": Param("str", "t")}, scope="tenant")

    def test_the_access_log_is_admin_only(self) -> None:
        """The access_log query is scoped admin."""
        assert QUERIES["access_log"].scope == "admin"


class TestScopeParams:
    def test_tenant_token_gets_its_tenant_bound(self) -> None:
        """A tenant query run by a one-tenant token gets tenant= its tenant, whatever else is given."""
        assert scope_params("blocked_attempts", {"limit": "5"}, ACME) == {"limit": "5", "tenant": "acme"}

    @pytest.mark.parametrize("given", ["", "  ", None])
    def test_an_empty_tenant_means_its_own(self, given: str | None) -> None:
        """An empty tenant (which the queries read as "no filter") is bound to the token's tenant."""
        assert scope_params("blocked_attempts", {"tenant": given}, ACME)["tenant"] == "acme"

    @pytest.mark.parametrize("given", ["globex", "ACME", "acme ", "%"])
    def test_another_tenant_is_forbidden(self, given: str) -> None:
        """Any tenant the token does not hold, near misses included, is Forbidden."""
        with pytest.raises(Forbidden, match="may not read tenant"):
            scope_params("blocked_attempts", {"tenant": given}, ACME)

    def test_own_tenant_given_is_kept(self) -> None:
        """Naming its own tenant is allowed."""
        assert scope_params("event_counts", {"tenant": "acme"}, ACME) == {"tenant": "acme"}

    def test_several_tenants_must_pick_one(self) -> None:
        """A token with two tenant roles names one; none named is a QueryError on `tenant`."""
        assert scope_params("runs", {"tenant": "globex"}, TWO)["tenant"] == "globex"
        with pytest.raises(QueryError, match="give tenant=") as caught:
            scope_params("runs", {}, TWO)
        assert caught.value.param == "tenant"

    @pytest.mark.parametrize("name", sorted(n for n, q in QUERIES.items() if q.scope != "tenant"))
    def test_global_and_admin_queries_are_forbidden_to_tenants(self, name: str) -> None:
        """Every query that is not tenant-scoped is Forbidden to a tenant token."""
        with pytest.raises(Forbidden):
            scope_params(name, {}, ACME)

    @pytest.mark.parametrize("name", sorted(QUERIES))
    def test_auditor_reads_everything_but_the_access_log(self, name: str) -> None:
        """An auditor's parameters pass unchanged, except for the admin-only access log."""
        if QUERIES[name].scope == "admin":
            with pytest.raises(Forbidden, match="admin"):
                scope_params(name, {}, AUDITOR)
        else:
            assert scope_params(name, {"tenant": "x"} if "tenant" in QUERIES[name].params else {}, AUDITOR) == (
                {"tenant": "x"} if "tenant" in QUERIES[name].params else {}
            )

    def test_admin_reads_the_access_log(self) -> None:
        """Admin may run access_log."""
        assert scope_params("access_log", {"limit": "1"}, ADMIN) == {"limit": "1"}

    def test_no_known_role_reads_nothing(self) -> None:
        """A valid identity without a role this code knows is Forbidden every query."""
        for name in QUERIES:
            with pytest.raises(Forbidden):
                scope_params(name, {}, NOBODY)

    def test_unknown_query(self) -> None:
        """An unknown name is UnknownQueryError (a KeyError: 404)."""
        with pytest.raises(UnknownQueryError):
            scope_params("no_such_query", {}, ADMIN)


# -- the token file -----------------------------------------------------------------------------


def token_file(path: Path, *entries: tuple[str, str, list[str]]) -> Path:
    """Write a token file of (subject, token, roles)."""
    path.write_text(
        json.dumps({"tokens": [{"subject": s, "sha256": hash_token(t), "roles": r} for s, t, r in entries]})
    )
    return path


def touch_later(path: Path) -> None:
    """Move the file's mtime on, so a change within one clock tick is seen as a change too."""
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


class TestTokenFile:
    def test_authenticates_by_hash(self, tmp_path: Path) -> None:
        """A token whose SHA-256 is in the file gets its subject and roles; others are refused."""
        tokens = TokenFile(token_file(tmp_path / "t.yaml", ("alice", "s3cret", ["auditor"])))
        assert tokens.authenticate("s3cret") == Identity("alice", frozenset({"auditor"}))
        with pytest.raises(AuthError, match="unknown token"):
            tokens.authenticate("s3cret ")
        with pytest.raises(AuthError):
            tokens.authenticate(hash_token("s3cret"))

    def test_a_changed_file_is_read_again(self, tmp_path: Path) -> None:
        """Adding and removing entries takes effect on the next call, without a new TokenFile."""
        path = token_file(tmp_path / "t.yaml", ("alice", "one", ["auditor"]))
        tokens = TokenFile(path)
        assert tokens.authenticate("one").subject == "alice"
        token_file(path, ("bob", "two", ["tenant:acme"]))
        touch_later(path)
        assert tokens.authenticate("two").subject == "bob"
        with pytest.raises(AuthError):
            tokens.authenticate("one")

    def test_a_broken_file_refuses_every_token(self, tmp_path: Path) -> None:
        """A file made unparsable while serving fails closed, and recovers once fixed."""
        path = token_file(tmp_path / "t.yaml", ("alice", "one", ["auditor"]))
        tokens = TokenFile(path)
        path.write_text("tokens: [oops")
        touch_later(path)
        with pytest.raises(AuthError):
            tokens.authenticate("one")
        token_file(path, ("alice", "one", ["auditor"]))
        touch_later(path)
        assert tokens.authenticate("one").subject == "alice"

    def test_a_removed_file_refuses_every_token(self, tmp_path: Path) -> None:
        """Deleting the file revokes everything."""
        path = token_file(tmp_path / "t.yaml", ("alice", "one", ["auditor"]))
        tokens = TokenFile(path)
        path.unlink()
        with pytest.raises(AuthError):
            tokens.authenticate("one")

    def test_missing_file_is_a_config_error(self, tmp_path: Path) -> None:
        """The constructor names a file it cannot read."""
        with pytest.raises(ConfigError, match="cannot read token file"):
            TokenFile(tmp_path / "absent.yaml")

    @pytest.mark.parametrize(
        ("text", "message"),
        [
            ("tokens: [oops", "not YAML"),
            ("- a\n", "expected a mapping"),
            ("tokens: {a: 1}", "must be a list"),
            ("tokens: [{subject: a, sha256: abc, roles: [admin]}]", "64 lowercase hex"),
            (f"tokens: [{{subject: a, sha256: {'A' * 64}, roles: [admin]}}]", "64 lowercase hex"),
            (f"tokens: [{{subject: a, sha256: {'a' * 64}, roles: []}}]", "non-empty list"),
            (f"tokens: [{{subject: a, sha256: {'a' * 64}, roles: [root]}}]", "unknown role 'root'"),
            (f"tokens: [{{subject: '', sha256: {'a' * 64}, roles: [admin]}}]", "subject must be"),
            (f"tokens: [{{subject: a, sha256: {'a' * 64}, role: [admin]}}]", "unknown key 'role'"),
            (
                f"tokens: [{{subject: a, sha256: {'a' * 64}, roles: [admin]}}, "
                f"{{subject: a, sha256: {'b' * 64}, roles: [admin]}}]",
                "appears twice",
            ),
            (
                f"tokens: [{{subject: a, sha256: {'a' * 64}, roles: [admin]}}, "
                f"{{subject: b, sha256: {'a' * 64}, roles: [admin]}}]",
                "same token hash",
            ),
        ],
    )
    def test_malformed_files_name_the_problem(self, text: str, message: str) -> None:
        """Each malformation is a ConfigError naming the file, the entry and the field."""
        with pytest.raises(ConfigError, match=message) as caught:
            parse_token_file(text, source="t.yaml")
        assert str(caught.value).startswith("t.yaml")

    def test_an_empty_file_has_no_tokens(self) -> None:
        """An empty file, or an empty list, is valid and accepts nothing."""
        assert parse_token_file("", source="t") == []
        assert parse_token_file("tokens: []", source="t") == []

    def test_threads_reading_during_a_rewrite(self, tmp_path: Path) -> None:
        """Eight threads authenticating while the file is rewritten twenty times all get an answer:
        the identity or AuthError, never another exception."""
        path = token_file(tmp_path / "t.yaml", ("alice", "one", ["auditor"]))
        tokens = TokenFile(path)
        failures: list[BaseException] = []
        stop = threading.Event()

        def read() -> None:
            while not stop.is_set():
                try:
                    tokens.authenticate("one")
                except AuthError:
                    pass
                except BaseException as exc:
                    failures.append(exc)

        threads = [threading.Thread(target=read) for _ in range(8)]
        for thread in threads:
            thread.start()
        for n in range(20):
            token_file(path, ("alice", "one", ["auditor"]), (f"user{n}", f"t{n}", ["admin"]))
        stop.set()
        for thread in threads:
            thread.join()
        assert failures == []


# -- OIDC bearer tokens -------------------------------------------------------------------------

ISSUER = "https://idp.example"
AUDIENCE = "callgate-read-api"


class Keys:
    """An RSA and an EC signing key made for the test, and their JWKS."""

    def __init__(self) -> None:
        self.rsa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.ec = ec.generate_private_key(ec.SECP256R1())
        self.other = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def jwks(self, *, rsa_kid: str = "rsa-1") -> dict[str, Any]:
        rsa_jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.rsa.public_key()))
        ec_jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(self.ec.public_key()))
        return {
            "keys": [
                {**rsa_jwk, "kid": rsa_kid, "use": "sig", "alg": "RS256"},
                {**ec_jwk, "kid": "ec-1", "use": "sig", "alg": "ES256"},
            ]
        }

    def sign(self, key: Any = None, *, kid: str = "rsa-1", alg: str = "RS256", **overrides: Any) -> str:
        now = int(time.time())
        claims = {"sub": "dana", "iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + 300, "roles": ["auditor"]}
        claims.update(overrides)
        claims = {k: v for k, v in claims.items() if v is not None}
        return jwt.encode(claims, key or self.rsa, algorithm=alg, headers={"kid": kid})


@pytest.fixture(scope="module")
def keys() -> Keys:
    return Keys()


@pytest.fixture
def jwks_file(tmp_path: Path, keys: Keys) -> Path:
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(keys.jwks()))
    return path


class JwksServer:
    """A tiny local HTTP server answering GET /jwks with a JWKS it can be told to change; it counts
    its requests."""

    def __init__(self, jwks: dict[str, Any]) -> None:
        self.jwks = jwks
        self.requests = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.requests += 1
                body = json.dumps(outer.jwks).encode()
                self.send_response(200 if self.path == "/jwks" else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/jwks"


@pytest.fixture
def jwks_server(keys: Keys) -> Iterator[JwksServer]:
    server = JwksServer(keys.jwks())
    server.thread.start()
    try:
        yield server
    finally:
        server.server.shutdown()
        server.server.server_close()


def authenticator(jwks: str | Path, **options: Any) -> JwtAuthenticator:
    return JwtAuthenticator(str(jwks), audience=AUDIENCE, issuer=ISSUER, **options)


class TestJwtAuthenticator:
    @pytest.mark.parametrize("source", ["file", "url"])
    def test_accepts_a_good_token(self, source: str, keys: Keys, jwks_file: Path, jwks_server: JwksServer) -> None:
        """A token signed by a JWKS key, for our audience and issuer, not expired: its sub and roles."""
        auth = authenticator(jwks_file if source == "file" else jwks_server.url)
        assert auth.authenticate(keys.sign()) == Identity("dana", frozenset({"auditor"}))
        assert auth.authenticate(keys.sign(keys.ec, kid="ec-1", alg="ES256", roles=["tenant:acme"])) == Identity(
            "dana", frozenset({"tenant:acme"})
        )

    @pytest.mark.parametrize(
        ("overrides", "message"),
        [
            ({"exp": int(time.time()) - 3600}, "expired"),
            ({"aud": "someone-else"}, "audience"),
            ({"iss": "https://evil.example"}, "issuer"),
            ({"exp": None}, "exp"),
            ({"sub": None}, "sub"),
        ],
    )
    def test_refuses_expired_wrong_audience_wrong_issuer(
        self, overrides: dict[str, Any], message: str, keys: Keys, jwks_file: Path
    ) -> None:
        """Expired, for another audience, from another issuer, or without exp or sub: AuthError saying so."""
        with pytest.raises(AuthError, match=message):
            authenticator(jwks_file).authenticate(keys.sign(**overrides))

    def test_refuses_a_token_signed_by_another_key(self, keys: Keys, jwks_file: Path) -> None:
        """A key not in the JWKS, claiming a known kid, fails the signature check."""
        with pytest.raises(AuthError, match="invalid token"):
            authenticator(jwks_file).authenticate(keys.sign(keys.other))

    def test_refuses_an_unknown_kid(self, keys: Keys, jwks_file: Path) -> None:
        """A kid the JWKS does not hold is refused naming it."""
        with pytest.raises(AuthError, match="no key 'nope'"):
            authenticator(jwks_file).authenticate(keys.sign(kid="nope"))

    def test_refuses_shared_secret_and_none_algorithms(self, keys: Keys, jwks_file: Path) -> None:
        """HS256 (a shared secret; the classic key-confusion attack) and "none" are never accepted."""
        auth = authenticator(jwks_file)
        hs = jwt.encode({"sub": "x", "iss": ISSUER, "aud": AUDIENCE, "exp": int(time.time()) + 60}, "k" * 32)
        with pytest.raises(AuthError, match="not accepted"):
            auth.authenticate(hs)
        unsigned = jwt.encode({"sub": "x"}, None, algorithm="none")
        with pytest.raises(AuthError, match="not accepted"):
            auth.authenticate(unsigned)

    def test_refuses_what_is_not_a_jwt(self, jwks_file: Path) -> None:
        """Random text is AuthError, not a crash."""
        with pytest.raises(AuthError, match="not a JWT"):
            authenticator(jwks_file).authenticate("cg_not-a-jwt")

    def test_roles_from_a_nested_claim_unknown_ones_ignored(self, keys: Keys, jwks_file: Path) -> None:
        """--jwt-roles-claim realm_access.roles reads nested roles; an IdP's other roles grant nothing."""
        token = keys.sign(realm_access={"roles": ["offline_access", "tenant:acme", "admin "]}, roles=None)
        assert authenticator(jwks_file, roles_claim="realm_access.roles").authenticate(token).roles == {"tenant:acme"}

    def test_roles_as_a_space_separated_text(self, keys: Keys, jwks_file: Path) -> None:
        """A roles claim that is one text (as a scope claim is) splits on spaces."""
        token = keys.sign(scope="openid tenant:acme tenant:globex")
        assert authenticator(jwks_file, roles_claim="scope").authenticate(token).tenants == {"acme", "globex"}

    def test_a_changed_jwks_file_is_read_again(self, keys: Keys, jwks_file: Path) -> None:
        """Rotating the key id in the file is seen on the next call."""
        auth = authenticator(jwks_file)
        jwks_file.write_text(json.dumps(keys.jwks(rsa_kid="rsa-2")))
        touch_later(jwks_file)
        assert auth.authenticate(keys.sign(kid="rsa-2")).subject == "dana"
        with pytest.raises(AuthError):
            auth.authenticate(keys.sign(kid="rsa-1"))

    def test_the_jwks_url_is_fetched_once_then_cached(self, keys: Keys, jwks_server: JwksServer) -> None:
        """Ten tokens cost one fetch; a new kid makes it fetch again."""
        auth = authenticator(jwks_server.url, jwks_refetch_s=0)
        for _ in range(10):
            auth.authenticate(keys.sign())
        assert jwks_server.requests == 1
        jwks_server.jwks = keys.jwks(rsa_kid="rsa-2")
        assert auth.authenticate(keys.sign(kid="rsa-2")).subject == "dana"
        assert jwks_server.requests == 2

    def test_an_unreachable_jwks_url_refuses(self, keys: Keys) -> None:
        """A JWKS URL nobody answers: AuthError, not a crash."""
        with pytest.raises(AuthError, match="no signing key"):
            authenticator("http://127.0.0.1:1/jwks", timeout_s=2).authenticate(keys.sign())

    @pytest.mark.parametrize(("text", "message"), [("{", "JWKS"), ('{"keys": []}', "JWKS")])
    def test_a_bad_jwks_file_is_a_config_error(self, tmp_path: Path, text: str, message: str) -> None:
        """The constructor refuses a JWKS file it cannot use."""
        path = tmp_path / "jwks.json"
        path.write_text(text)
        with pytest.raises(ConfigError, match=message):
            authenticator(path)

    def test_missing_audience_or_issuer(self, jwks_file: Path) -> None:
        """Audience and issuer are both needed."""
        with pytest.raises(ConfigError, match="audience and an issuer"):
            JwtAuthenticator(str(jwks_file), audience="", issuer=ISSUER)


class TestAuthenticatorChain:
    def test_first_accepting_wins(self, tmp_path: Path, keys: Keys, jwks_file: Path) -> None:
        """A token file and a JWKS together: each kind of token is accepted by its authenticator."""
        chain = AuthenticatorChain(
            TokenFile(token_file(tmp_path / "t.yaml", ("svc", "cg_x", ["admin"]))), authenticator(jwks_file)
        )
        assert chain.authenticate("cg_x").subject == "svc"
        assert chain.authenticate(keys.sign()).subject == "dana"
        with pytest.raises(AuthError):
            chain.authenticate("cg_y")
