"""`callgate token new|revoke|list`, and `callgate materialize`'s read API authentication options: the
token file round trip, refused starts (exit 2, one line), and a running materializer asked with and
without a token by `callgate coverage --api --token`."""

from __future__ import annotations

import select
import signal
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from callgate.broker import EmbeddedBroker
from callgate.cli import app
from consumers.auth import AuthError, TokenFile, hash_token

runner = CliRunner()


def new(file: Path, subject: str, *roles: str) -> str:
    """`callgate token new`; the token it printed."""
    args = ["token", "new", "--file", str(file), "--subject", subject]
    for role in roles:
        args += ["--role", role]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return result.stdout.strip()


class TestTokenCommands:
    def test_new_revoke_round_trip(self, tmp_path: Path) -> None:
        """new creates the file mode 0600 and prints the token alone on stdout; the file holds its
        SHA-256, not the token; the read API's TokenFile accepts it; revoke removes it."""
        file = tmp_path / "tokens.yaml"
        token = new(file, "alice", "auditor", "tenant:acme")
        assert token.startswith("cg_")
        assert "\n" not in token
        assert stat.S_IMODE(file.stat().st_mode) == 0o600
        text = file.read_text()
        assert token not in text
        assert hash_token(token) in text
        identity = TokenFile(file).authenticate(token)
        assert (identity.subject, identity.roles) == ("alice", {"auditor", "tenant:acme"})

        bob = new(file, "bob", "admin")
        listed = runner.invoke(app, ["token", "list", "--file", str(file)])
        assert listed.exit_code == 0
        assert [line.split("\t")[:2] for line in listed.stdout.splitlines()] == [
            ["alice", "auditor,tenant:acme"],
            ["bob", "admin"],
        ]
        assert token not in listed.stdout
        assert bob not in listed.stdout

        result = runner.invoke(app, ["token", "revoke", "--file", str(file), "--subject", "alice"])
        assert result.exit_code == 0, result.output
        with pytest.raises(AuthError):
            TokenFile(file).authenticate(token)
        assert TokenFile(file).authenticate(bob).subject == "bob"
        assert stat.S_IMODE(file.stat().st_mode) == 0o600

    def test_a_duplicate_subject_is_refused(self, tmp_path: Path) -> None:
        """A second token for one subject exits 2 naming it, and the file keeps the first."""
        file = tmp_path / "tokens.yaml"
        first = new(file, "alice", "admin")
        result = runner.invoke(app, ["token", "new", "--file", str(file), "--subject", "alice", "--role", "admin"])
        assert result.exit_code == 2
        assert "already has a token for subject 'alice'" in result.stderr
        assert result.stdout == ""
        assert TokenFile(file).authenticate(first).subject == "alice"

    @pytest.mark.parametrize("role", ["root", "tenant:", "Tenant:acme"])
    def test_an_unknown_role_is_refused(self, tmp_path: Path, role: str) -> None:
        """An unknown role exits 2 naming it, and no file is written."""
        file = tmp_path / "tokens.yaml"
        result = runner.invoke(app, ["token", "new", "--file", str(file), "--subject", "a", "--role", role])
        assert result.exit_code == 2
        assert f"unknown role {role!r}" in result.stderr
        assert not file.exists()

    def test_revoking_an_unknown_subject_is_refused(self, tmp_path: Path) -> None:
        """revoke of a subject that is not there exits 2 naming it."""
        file = tmp_path / "tokens.yaml"
        new(file, "alice", "admin")
        result = runner.invoke(app, ["token", "revoke", "--file", str(file), "--subject", "bob"])
        assert result.exit_code == 2
        assert "no token for subject 'bob'" in result.stderr

    def test_a_malformed_file_is_refused(self, tmp_path: Path) -> None:
        """new on a file that is not a token file exits 2 naming the file, and leaves it alone."""
        file = tmp_path / "tokens.yaml"
        file.write_text("tokens: [oops")
        result = runner.invoke(app, ["token", "new", "--file", str(file), "--subject", "a", "--role", "admin"])
        assert result.exit_code == 2
        assert str(file) in result.stderr
        assert file.read_text() == "tokens: [oops"


def callgate(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "callgate.cli", *args], capture_output=True, text=True, timeout=60, check=False, cwd=cwd
    )


class TestMaterializeRefusals:
    """Startup errors of the read API's options: exit 2 with one line naming the culprit, before the
    store is created or Kafka reached (nothing listens at the bootstrap given)."""

    @pytest.mark.parametrize(
        ("extra", "named"),
        [
            (["--api", "0.0.0.0:8765"], "--insecure-no-auth"),
            (["--api", "0.0.0.0:8765", "--jwt-jwks", "jwks.json"], "missing: --jwt-audience, --jwt-issuer"),
            (["--api", "127.0.0.1:0", "--tls-cert", "api.crt"], "--tls-cert and --tls-key go together"),
            (["--api", "127.0.0.1:0", "--auth", "absent.yaml"], "--auth: cannot read token file absent.yaml"),
            (["--auth", "absent.yaml"], "give --api too"),
            (["--api", "0.0.0.0:1", "--auth", "t.yaml", "--insecure-no-auth"], "contradicts"),
            (["--api", "127.0.0.1:0", "--tls-cert", "t.yaml", "--tls-key", "t.yaml"], "cannot load them"),
            (
                ["--api", "127.0.0.1:0", "--jwt-jwks", "t.yaml", "--jwt-audience", "a", "--jwt-issuer", "i"],
                "--jwt-jwks: JWKS t.yaml",
            ),
        ],
    )
    def test_refused_with_one_line(self, tmp_path: Path, extra: list[str], named: str) -> None:
        """Each bad combination exits 2 with one line on stderr, naming what to fix; no store is made."""
        (tmp_path / "t.yaml").write_text("tokens: []\n")
        db = tmp_path / "audit.duckdb"
        result = callgate("materialize", "--bootstrap", "127.0.0.1:1", "--db", str(db), *extra, cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        lines = result.stderr.splitlines()
        assert len(lines) == 1, lines
        assert lines[0].startswith("error: ")
        assert named in lines[0]
        assert not db.exists()


def read_line(process: subprocess.Popen[str], marker: str, deadline_s: float = 60.0) -> str:
    """The first stdout line of `process` containing `marker`, waiting at most `deadline_s`."""
    assert process.stdout is not None
    deadline = time.monotonic() + deadline_s
    while (remaining := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([process.stdout], [], [], remaining)
        if not ready:
            break
        line = process.stdout.readline()
        if not line:
            break
        if marker in line:
            return line
    process.kill()
    raise AssertionError(
        f"no line with {marker!r} within {deadline_s} s; stderr: {process.stderr and process.stderr.read()}"
    )


@pytest.fixture
def materializing(kafka_broker: EmbeddedBroker, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """`callgate materialize --api 127.0.0.1:0 --auth FILE` running on its own topic: (API URL, token file)."""
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text("tokens: []\n")
    topic = f"auth-{uuid.uuid4().hex[:8]}"
    command = [sys.executable, "-m", "callgate.cli", "materialize", "--bootstrap", kafka_broker.bootstrap]
    command += ["--topic", topic, "--db", str(tmp_path / "audit.duckdb"), "--api", "127.0.0.1:0"]
    command += ["--auth", str(tokens), "--partitions", "1"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        try:
            url = read_line(process, "read API at ").split("read API at ", 1)[1].strip()
            yield url, tokens
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


class TestMaterializeWithAuth:
    def test_coverage_needs_the_token_and_the_read_is_logged(self, materializing: tuple[str, Path]) -> None:
        """A running `materialize --auth`: /healthz open, queries 401 without a token; `coverage --api`
        exits 2 without --token saying so, checks with CALLGATE_TOKEN, and its reads are in the
        access log under its subject."""
        url, tokens = materializing
        assert httpx.get(f"{url}/healthz").status_code in (200, 503)
        assert httpx.get(f"{url}/v1/queries/coverage_summary").status_code == 401
        auditor = new(tokens, "ci-coverage", "auditor")
        admin = new(tokens, "ops", "admin")

        refused = runner.invoke(app, ["coverage", "--api", url], env={"COLUMNS": "200"})
        assert refused.exit_code == 2, refused.output
        assert "--token or CALLGATE_TOKEN" in refused.output

        checked = runner.invoke(app, ["coverage", "--api", url], env={"CALLGATE_TOKEN": auditor, "COLUMNS": "200"})
        assert checked.exit_code in (0, 1), checked.output

        logged = httpx.get(
            f"{url}/v1/queries/access_log",
            params={"subject": "ci-coverage"},
            headers={"Authorization": f"Bearer {admin}"},
        )
        assert logged.status_code == 200
        assert {row["query"] for row in logged.json()["rows"]} >= {"coverage_summary"}

    def test_verify_and_replay_take_the_token(self, materializing: tuple[str, Path]) -> None:
        """`verify --api` and `replay --api` without a token exit 2 saying to give one; with --token
        they read (an unknown event has no proof; an empty store has nothing to replay)."""
        url, tokens = materializing
        auditor = new(tokens, "ci-replay", "auditor")
        policy = str(Path(__file__).parents[2] / "callgate" / "support_desk.policy.yaml")
        verify = ["verify", "--api", url, "--event", "no-such-event"]
        replay = ["replay", "--api", url, "--policy", policy, "--since", "all"]
        for args in (verify, replay):
            refused = runner.invoke(app, args, env={"COLUMNS": "200", "CALLGATE_TOKEN": ""})
            assert refused.exit_code == 2, refused.output
            assert "--token or CALLGATE_TOKEN" in refused.output
        proved = runner.invoke(app, [*verify, "--token", auditor])
        assert proved.exit_code == 1, proved.output
        assert "no proof" in proved.stderr
        replayed = runner.invoke(app, [*replay, "--token", auditor], env={"COLUMNS": "200"})
        assert "nothing to replay: no stored call" in replayed.output, replayed.output
        assert "--token" not in replayed.output


class TestAmbiguousTenantRoles:
    @pytest.mark.parametrize("role", ["tenant:*", "tenant:a,b", "tenant:a b", "tenant:a;b", "tenant:ac?e"])
    def test_token_new_refuses_a_tenant_id_that_reads_as_a_list_or_a_pattern(self, tmp_path: Path, role: str) -> None:
        """`callgate token new --role tenant:*` (or a,b or "a b"), run as a process, exits 2 with one
        line naming the role, and writes no file."""
        file = tmp_path / "tokens.yaml"
        result = callgate("token", "new", "--file", str(file), "--subject", "a", "--role", role, cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        lines = result.stderr.splitlines()
        assert len(lines) == 1, lines
        assert repr(role) in lines[0]
        assert "one --role tenant:<id> per tenant" in lines[0]
        assert result.stdout == ""
        assert not file.exists()


class Jwks:
    """An RSA and an EC signing key of one issuer, and the JWKS file naming them `rsa-1` and `ec-1`."""

    issuer, audience = "https://idp.test", "callgate"

    def __init__(self, directory: Path) -> None:
        import json

        import jwt
        from cryptography.hazmat.primitives.asymmetric import ec, rsa

        self.rsa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.ec = ec.generate_private_key(ec.SECP256R1())
        keys = [
            {**jwt.algorithms.RSAAlgorithm.to_jwk(self.rsa.public_key(), as_dict=True), "kid": "rsa-1"},
            {**jwt.algorithms.ECAlgorithm.to_jwk(self.ec.public_key(), as_dict=True), "kid": "ec-1"},
        ]
        self.path = directory / "jwks.json"
        self.path.write_text(json.dumps({"keys": keys}))

    def sign(self, key: object, algorithm: str, kid: str) -> str:
        import jwt

        claims = {"sub": "erin", "iss": self.issuer, "aud": self.audience, "exp": int(time.time()) + 600}
        return jwt.encode({**claims, "roles": ["tenant:acme"]}, key, algorithm=algorithm, headers={"kid": kid})


@pytest.fixture(scope="class")
def api_process(
    kafka_broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str, Jwks]]:
    """`callgate materialize --api 127.0.0.1:0` with a token file and a JWKS, as a process of its own:
    (API URL, an admin token, the JWKS)."""
    tmp = tmp_path_factory.mktemp("api_process")
    tokens = tmp / "tokens.yaml"
    tokens.write_text("tokens: []\n")
    admin = new(tokens, "ops", "admin")
    jwks = Jwks(tmp)
    command = [sys.executable, "-m", "callgate.cli", "materialize", "--bootstrap", kafka_broker.bootstrap]
    command += ["--topic", f"api-{uuid.uuid4().hex[:8]}", "--db", str(tmp / "audit.duckdb"), "--api", "127.0.0.1:0"]
    command += ["--auth", str(tokens), "--partitions", "1", "--jwt-jwks", str(jwks.path)]
    command += ["--jwt-audience", jwks.audience, "--jwt-issuer", jwks.issuer]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        try:
            url = read_line(process, "read API at ").split("read API at ", 1)[1].strip()
            yield url, admin, jwks
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


class TestReadApiProcess:
    """A running `callgate materialize --api` asked over HTTP the way an outsider would."""

    @pytest.mark.parametrize(("signer", "algorithm", "kid"), [("rsa", "RS256", "ec-1"), ("ec", "ES256", "rsa-1")])
    def test_a_jwt_naming_a_key_of_the_other_type_is_401(
        self, api_process: tuple[str, str, Jwks], signer: str, algorithm: str, kid: str
    ) -> None:
        """A JWT whose `kid` names a key of the other type (RS256 with the EC key's id, ES256 with the
        RSA key's) is refused with 401 saying so, not a 500; the same key with its own id reads."""
        url, _, jwks = api_process
        token = jwks.sign(getattr(jwks, signer), algorithm, kid)
        refused = httpx.get(f"{url}/v1/queries/blocked_attempts", headers={"Authorization": f"Bearer {token}"})
        assert refused.status_code == 401, refused.text
        assert f"signed with {algorithm}" in refused.json()["error"]
        own = jwks.sign(getattr(jwks, signer), algorithm, f"{signer}-1")
        assert httpx.get(f"{url}/v1/queries/blocked_attempts", headers={"Authorization": f"Bearer {own}"}).is_success

    def test_an_offset_beyond_64_bits_is_400_on_every_query(self, api_process: tuple[str, str, Jwks]) -> None:
        """`offset` one past the int64 maximum is 400 naming the parameter on every query that pages
        with it; the maximum itself is answered (no rows)."""
        url, admin, _ = api_process
        headers = {"Authorization": f"Bearer {admin}"}
        queries = httpx.get(f"{url}/v1/queries", headers=headers).json()["queries"]
        given = {"str": "x", "int": "1", "bool": "true", "ids": '["x"]', "datetime": "2026-01-01T00:00:00+00:00"}
        paged = {
            query["name"]: {p["name"]: given[p["type"]] for p in query["parameters"] if p["required"]}
            for query in queries
            if any(p["name"] == "offset" for p in query["parameters"])
        }
        assert len(paged) >= 13
        for name, required in paged.items():
            over = httpx.get(f"{url}/v1/queries/{name}", params={**required, "offset": str(2**63)}, headers=headers)
            assert over.status_code == 400, (name, over.text)
            assert "'offset'" in over.json()["error"]
        top = httpx.get(f"{url}/v1/queries/blocked_attempts", params={"offset": str(2**63 - 1)}, headers=headers)
        assert top.status_code == 200, top.text

    def test_a_request_without_a_token_leaves_an_access_log_line(self, api_process: tuple[str, str, Jwks]) -> None:
        """A query asked with no Authorization header is 401 and recorded: no subject, status 401."""
        url, admin, _ = api_process
        probe = f"probe-{uuid.uuid4().hex[:8]}"
        assert httpx.get(f"{url}/v1/queries/blocked_attempts", params={"tool": probe}).status_code == 401
        logged = httpx.get(
            f"{url}/v1/queries/access_log",
            params={"status": "401", "query_name": "blocked_attempts"},
            headers={"Authorization": f"Bearer {admin}"},
        )
        assert logged.status_code == 200, logged.text
        rows = [row for row in logged.json()["rows"] if probe in str(row["params"])]
        assert [(row["subject"], row["status"]) for row in rows] == [("", 401)]

    def test_a_trailing_slash_is_404_and_never_a_redirect_to_the_host_header(
        self, api_process: tuple[str, str, Jwks]
    ) -> None:
        """`/v1/queries/` asked with a forged Host header answers 404 naming the route, with no
        Location (Starlette would redirect to http://<Host>/v1/queries)."""
        url, admin, _ = api_process
        headers = {"Authorization": f"Bearer {admin}", "Host": "evil.example"}
        for path in ("/v1/queries/", "/healthz/", "/v1/queries/blocked_attempts/"):
            response = httpx.get(f"{url}{path}", headers=headers, follow_redirects=False)
            assert response.status_code == 404, (path, response.status_code)
            assert "location" not in response.headers
            assert "no trailing slash" in response.json()["error"]
