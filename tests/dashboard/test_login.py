"""Who a session reads as (`dashboard.login`): token files, tokens checked by a real read API, OIDC
claims; and the settings that choose the login, checked when built."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from callgate.cli import app
from consumers.api import ApiServer, HealthStatus, build_app
from consumers.auth import AuthError, TokenFile
from consumers.metrics import MaterializerMetrics
from consumers.runner import StoreQueryRunner
from consumers.store import AuditStore
from dashboard.config import ConfigurationError, DashboardConfig
from dashboard.login import api_access, claims_access, deployment_access, file_access


@pytest.fixture(scope="module")
def api(seeded_store: Any, token_file: Path) -> Iterator[str]:
    """The read API over a copy of the seeded store, checking tokens against the token file."""
    copy = seeded_store.path.with_name("login-api.duckdb")
    copy.write_bytes(seeded_store.path.read_bytes())
    store = AuditStore(copy)
    server = ApiServer(
        build_app(
            StoreQueryRunner(store), MaterializerMetrics(), lambda: HealthStatus(True), auth=TokenFile(token_file)
        ),
        port=0,
    )
    try:
        with server:
            yield server.url
    finally:
        store.close()
        copy.unlink()


class TestFileAccess:
    def test_roles_decide_the_tenant_and_the_global_pages(self, token_file: Path, tokens: dict[str, str]) -> None:
        """A tenant token is limited to its tenant and no global page; an auditor reads everything."""
        tenant = file_access(TokenFile(token_file), tokens["globex-admin"])
        assert (tenant.subject, tenant.tenant, tenant.all_tenants) == ("globex-admin", "globex", False)
        auditor = file_access(TokenFile(token_file), tokens["auditor"])
        assert (auditor.tenant, auditor.all_tenants) == (None, True)

    def test_an_unknown_token_is_refused(self, token_file: Path) -> None:
        """A token the file does not hold raises AuthError."""
        with pytest.raises(AuthError):
            file_access(TokenFile(token_file), "tok-nobody")

    def test_the_token_never_shows(self, token_file: Path, tokens: dict[str, str]) -> None:
        """Neither the access's text nor its cache key holds the token."""
        granted = file_access(TokenFile(token_file), tokens["auditor"])
        assert tokens["auditor"] not in repr(granted)
        assert tokens["auditor"] not in granted.key


class TestApiAccess:
    def test_a_tenant_token_is_checked_and_limited(self, api: str, tokens: dict[str, str]) -> None:
        """Through the read API a tenant token is accepted, forwarded, and limited (403 on a global query)."""
        granted = api_access(api, tokens["acme-admin"])
        assert (granted.token, granted.all_tenants) == (tokens["acme-admin"], False)
        assert api_access(api, tokens["auditor"]).all_tenants

    def test_a_wrong_token_is_refused(self, api: str) -> None:
        """A token the read API refuses (401) raises AuthError; so does none at all."""
        for token in ("tok-nobody", None):
            with pytest.raises(AuthError):
                deployment_access(api=api, token=token)


class TestClaimsAccess:
    def test_roles_from_the_claim(self) -> None:
        """From a file, the roles are the claim's (a list or a space-separated text); unknown ones grant nothing."""
        granted = claims_access(
            {"sub": "u-7", "email": "ana@example.com", "groups": ["tenant:acme", "staff"]},
            roles_claim="groups",
            api=None,
            id_token=None,
        )
        assert (granted.subject, granted.tenant, granted.all_tenants) == ("ana@example.com", "acme", False)
        assert claims_access(
            {"sub": "u-8", "roles": "auditor"}, roles_claim="roles", api=None, id_token=None
        ).all_tenants
        nothing = claims_access({"sub": "u-9", "roles": ["root"]}, roles_claim="roles", api=None, id_token=None)
        assert (nothing.all_tenants, nothing.tenant, nothing.identity and nothing.identity.roles) == (
            False,
            None,
            frozenset(),
        )

    def test_without_a_subject_or_an_id_token_to_forward(self, api: str) -> None:
        """Claims without sub or email are refused; through the API, so is a login whose ID token is not exposed."""
        with pytest.raises(AuthError, match="no subject"):
            claims_access({"roles": ["admin"]}, roles_claim="roles", api=None, id_token=None)
        with pytest.raises(AuthError, match="expose_tokens"):
            claims_access({"sub": "u-1"}, roles_claim="roles", api=api, id_token=None)


class TestSettings:
    @pytest.mark.parametrize(
        ("env", "culprit"),
        [
            ({"CALLGATE_API": "http://127.0.0.1:1", "CALLGATE_DASHBOARD_AUTH": "t.yaml"}, "CALLGATE_DASHBOARD_AUTH"),
            ({"CALLGATE_DB": "a.duckdb", "CALLGATE_DASHBOARD_LOGIN": "token"}, "CALLGATE_DASHBOARD_LOGIN"),
            ({"CALLGATE_DB": "a.duckdb", "CALLGATE_DASHBOARD_LOGIN": "magic"}, "CALLGATE_DASHBOARD_LOGIN"),
            (
                {"CALLGATE_API": "http://127.0.0.1:1", "CALLGATE_TOKEN": "t", "CALLGATE_DASHBOARD_LOGIN": "token"},
                "CALLGATE_TOKEN",
            ),
        ],
    )
    def test_logins_that_cannot_work_name_the_variable(self, env: dict[str, str], culprit: str) -> None:
        """A token file through the API, a token login without a file, an unknown login, a deployment
        token beside a login."""
        with pytest.raises(ConfigurationError) as caught:
            DashboardConfig.from_env(env)
        assert caught.value.variable == culprit

    def test_a_token_file_means_a_token_login(self) -> None:
        """CALLGATE_DASHBOARD_AUTH alone makes every session log in with a token; the config's text
        never holds the token."""
        assert DashboardConfig.from_env({"CALLGATE_DB": "a", "CALLGATE_DASHBOARD_AUTH": "t.yaml"}).login == "token"
        assert "s3cret" not in repr(
            DashboardConfig.from_env({"CALLGATE_API": "http://h:1", "CALLGATE_TOKEN": "s3cret"})
        )

    def test_a_token_file_that_cannot_be_read_is_refused_before_starting(self, tmp_path: Path) -> None:
        """--auth naming a missing or malformed file: exit 2 naming the option."""
        (tmp_path / "bad.yaml").write_text("tokens: [{subject: x}]", encoding="utf-8")
        for auth in (tmp_path / "missing.yaml", tmp_path / "bad.yaml"):
            result = CliRunner().invoke(app, ["dashboard", "--db", str(tmp_path / "a.duckdb"), "--auth", str(auth)])
            assert result.exit_code == 2
            assert "--auth" in result.output
