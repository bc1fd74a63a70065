"""Who a browser session of the dashboard reads as: its `Access`, from the login it gave.

Three ways in (docs/dashboard.md, *Login*):

- no login: every session reads as the deployment (`--db` without `--auth` reads everything; `--api`
  sends the deployment's `--token`, if any, and the read API decides);
- a token typed once per browser session (`--db FILE --auth TOKENS.yaml`: checked against the token
  file here and every named query scoped with `consumers.auth.scope_params`; `--api URL --login
  token`: checked by the read API, forwarded as the bearer token of every query);
- OpenID Connect through Streamlit's `st.login` (`--login oidc`): roles from a claim of the ID token;
  through `--api`, the ID token itself is forwarded (the read API checks it with `--jwt-jwks`).

Nothing here imports Streamlit; `dashboard.ui` keeps the `Access` in the session state (server
side), never in the URL.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from consumers.auth import ANONYMOUS, Authenticator, AuthError, Identity, parse_role
from consumers.reader import AccessDeniedError, ApiReader

__all__ = ["GLOBAL_PAGES", "Access", "api_access", "claims_access", "deployment_access", "file_access"]

GLOBAL_PAGES: Final = ("coverage", "pipeline")
"""The pages made only of queries that read every tenant (shown to admins and auditors only)."""

# A tenant query every role that reads anything may run: what a login is checked with through the API.
_PROBE: Final[tuple[str, dict[str, Any]]] = ("runs", {"limit": 1})
# What a reviewer limited to no tenant reads (consumers.auth.REVIEWER_QUERIES).
_REVIEWER_PROBE: Final[tuple[str, dict[str, Any]]] = ("pending_approvals", {"limit": 1})
# A global query: refused (403) for a token limited to tenants.
_GLOBAL_PROBE: Final[tuple[str, dict[str, Any]]] = ("pipeline_health", {})


@dataclass(frozen=True, slots=True)
class Access:
    """What one browser session reads as.

    `identity` is known when the dashboard itself enforces the roles (`--db` mode, OIDC claims); None
    when the read API does (the token is forwarded). `token` is the bearer token sent to the read
    API (None: none). `all_tenants` says whether the global pages (`GLOBAL_PAGES`) and proofs are
    shown; `tenant` is the one tenant the session is limited to, when there is one and it is known.
    """

    subject: str
    identity: Identity | None
    token: str | None
    all_tenants: bool
    tenant: str | None = None

    @property
    def key(self) -> str:
        """A cache key that tells sessions of different rights apart (a digest, never the token)."""
        material = f"{self.subject}\0{sorted(self.identity.roles) if self.identity else ''}\0{self.token or ''}"
        return hashlib.sha256(material.encode()).hexdigest()

    def __repr__(self) -> str:
        # Never the token.
        return f"Access({self.subject!r}, all_tenants={self.all_tenants}, tenant={self.tenant!r})"


def _of_identity(identity: Identity, token: str | None) -> Access:
    tenants = sorted(identity.tenants)
    one = tenants[0] if not identity.all_tenants and len(tenants) == 1 else None
    return Access(identity.subject, identity, token, identity.all_tenants, one)


def deployment_access(*, api: str | None, token: str | None) -> Access:
    """The access of every session when the dashboard has no login: everything from a file; through
    the read API, whatever `token` (the deployment's) may read, probed once. Raises what
    `api_access` raises when the API refuses the deployment's token."""
    if api is None:
        return _of_identity(ANONYMOUS, None)
    return api_access(api, token, subject="deployment")


def file_access(tokens: Authenticator, token: str) -> Access:
    """The access of a token typed at login in `--db --auth` mode; `AuthError` when the token file
    does not hold it."""
    return _of_identity(tokens.authenticate(token.strip()), None)


def api_access(api: str, token: str | None, *, subject: str = "token") -> Access:
    """The access of `token` through the read API at `api`: checked with one tenant query (refused:
    `AuthError`), then one global query (refused: limited to tenants). Blocks for two requests;
    raises `SourceUnavailableError` when the API cannot be reached."""
    clean = token.strip() if token is not None else None
    reader = ApiReader(api, token=clean)
    try:
        reader.query(*_PROBE)
    except AccessDeniedError as exc:
        if exc.status == 401:
            raise AuthError(str(exc)) from None
        try:
            # A reviewer without a tenant role reads the approval requests only.
            reader.query(*_REVIEWER_PROBE)
        except AccessDeniedError:
            raise AuthError(str(exc)) from None
        return Access(subject, None, clean, all_tenants=False)
    try:
        reader.query(*_GLOBAL_PROBE)
    except AccessDeniedError as exc:
        if exc.status == 401:
            raise AuthError(str(exc)) from None
        return Access(subject, None, clean, all_tenants=False)
    return Access(subject, None, clean, all_tenants=True)


def claims_access(claims: Mapping[str, Any], *, roles_claim: str, api: str | None, id_token: str | None) -> Access:
    """The access of an OIDC login: through `--api`, the ID token forwarded to the read API (which
    checks it and reads the roles itself); from a file, the roles listed in claim `roles_claim` (a
    list or a space-separated text; roles this code does not know grant nothing). Raises
    `AuthError` for claims without a subject, or, through the API, without an ID token to forward
    (`expose_tokens = "id"` in the `[auth]` settings)."""
    subject = str(claims.get("email") or claims.get("sub") or "")
    if not subject:
        raise AuthError("the identity provider's claims name no subject (sub or email)")
    if api is not None:
        if not id_token:
            raise AuthError('the ID token is not exposed: add expose_tokens = "id" to [auth] in secrets.toml')
        return api_access(api, id_token, subject=subject)
    raw = claims.get(roles_claim)
    items = raw.split() if isinstance(raw, str) else raw if isinstance(raw, list) else []
    roles = set()
    for item in items:
        try:
            roles.add(parse_role(str(item)))
        except ValueError:
            continue
    return _of_identity(Identity(subject, frozenset(roles)), None)
