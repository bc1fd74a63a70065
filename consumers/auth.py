"""Who may read the audit store, and which of its rows: identities, token checks and query scoping.

The read API (and the dashboard's direct `--db` mode) turn a bearer token into an `Identity` with an
`Authenticator`, then call `scope_params` before every named query. `scope_params` is the one place
the rule lives:

- `admin`: every query, the access log and `/metrics` included.
- `auditor`: every tenant, every query but the access log (read only, as every role is).
- `reviewer`: decides approval requests (`consumers.approvals`); alone it reads the approval queries
  (`pending_approvals`, `approval_request`) of every tenant, with `tenant:<id>` roles only theirs.
- `tenant:<id>`: the "tenant" queries only (`consumers.queries.QueryScope`), with their `tenant`
  parameter bound to `<id>`; a caller-given other tenant is refused, "global" and "admin" queries
  are refused. A token with several `tenant:` roles names one with `tenant=` on each query.

Authenticators:

- `TokenFile(path)`: the YAML file `tokens: [{subject, sha256, roles}, ...]` (`callgate token new`
  writes it); tokens are kept as SHA-256 hashes only; a changed file is read again on the next call.
- `JwtAuthenticator(jwks, audience=..., issuer=...)`: OIDC bearer tokens (JWTs) checked with pyjwt
  against a JWKS file or URL: signature, expiry, audience, issuer; roles from a claim.
- `AuthenticatorChain(a, b)`: the first that accepts the token.

Every authenticator is safe to call from several threads at once and may block (a stat, a file
read, a JWKS fetch): call it off the event loop.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

import yaml

from consumers.queries import QUERIES, ParamValue, QueryError, UnknownQueryError

__all__ = [
    "ADMIN",
    "ANONYMOUS",
    "AUDITOR",
    "REVIEWER",
    "REVIEWER_QUERIES",
    "TENANT_PREFIX",
    "AuthError",
    "Authenticator",
    "AuthenticatorChain",
    "ConfigError",
    "Forbidden",
    "Identity",
    "JwtAuthenticator",
    "TokenEntry",
    "TokenFile",
    "hash_token",
    "parse_role",
    "parse_token_file",
    "scope_params",
]

log = logging.getLogger(__name__)

ADMIN: Final = "admin"
AUDITOR: Final = "auditor"
TENANT_PREFIX: Final = "tenant:"
REVIEWER: Final = "reviewer"
REVIEWER_QUERIES: Final = frozenset({"pending_approvals", "approval_request"})
"""What the reviewer role reads: the approval requests (of its `tenant:` roles' tenants, if it has any)."""

_HEX64 = re.compile(r"[0-9a-f]{64}")
_TENANT_ID = re.compile(r"[^\s\x00-\x1f\x7f](?:[^\x00-\x1f\x7f]*[^\s\x00-\x1f\x7f])?")


class AuthError(Exception):
    """Missing, unknown, expired or otherwise bad credentials (the read API answers 401)."""


class Forbidden(Exception):
    """Valid credentials whose roles do not allow what was asked (the read API answers 403)."""


class ConfigError(ValueError):
    """A token file, JWKS or authenticator setting that cannot be used; the message names the file
    or setting and what is wrong (a command exits 2 with it)."""


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a token belongs to (`subject`) and what it may read (`roles`: "admin", "auditor",
    "tenant:<id>"; others are kept but grant nothing)."""

    subject: str
    roles: frozenset[str]

    @property
    def admin(self) -> bool:
        """Everything, the access log and metrics included."""
        return ADMIN in self.roles

    @property
    def all_tenants(self) -> bool:
        """Every tenant's rows and the global queries (admin or auditor)."""
        return ADMIN in self.roles or AUDITOR in self.roles

    @property
    def tenants(self) -> frozenset[str]:
        """The tenant ids of the `tenant:<id>` roles (empty for none)."""
        return frozenset(role[len(TENANT_PREFIX) :] for role in self.roles if role.startswith(TENANT_PREFIX))


ANONYMOUS: Final = Identity("anonymous", frozenset({ADMIN}))
"""The identity of every request when the read API runs without authentication (loopback, or
`--insecure-no-auth`): it may read everything, as before authentication existed."""


def parse_role(text: str) -> str:
    """`text` if it is a role this code knows ("admin", "auditor", "tenant:<id>" with a non-empty id
    without control characters or surrounding spaces); `ValueError` naming it otherwise."""
    if text in (ADMIN, AUDITOR, REVIEWER):
        return text
    if text.startswith(TENANT_PREFIX) and _TENANT_ID.fullmatch(text[len(TENANT_PREFIX) :]):
        return text
    raise ValueError(f"unknown role {text!r}: use admin, auditor, reviewer or tenant:<id>")


class Authenticator(Protocol):
    """Turns a bearer token into an `Identity`."""

    def authenticate(self, token: str) -> Identity:
        """The token's identity; raises `AuthError` for a token it does not accept. Safe from several
        threads; may block."""
        ...


def scope_params(query: str, params: Mapping[str, ParamValue], identity: Identity) -> dict[str, ParamValue]:
    """The parameters to run `query` with on behalf of `identity`: `params` as given, with a tenant
    query's `tenant` bound to the identity's tenant when it is limited to tenants.

    Raises `UnknownQueryError` for a name not in `QUERIES`, `Forbidden` when the identity may not run
    the query or asks for a tenant it does not hold, and `QueryError` (param "tenant") when it holds
    several tenants and names none. Pure and cheap; the only place this rule lives.
    """
    spec = QUERIES.get(query)
    if spec is None:
        raise UnknownQueryError(f"unknown query {query!r}; known: {', '.join(sorted(QUERIES))}", query=query)
    scoped = dict(params)
    if spec.scope == "admin":
        if not identity.admin:
            raise Forbidden(f"query {query!r} needs the admin role")
        return scoped
    if identity.all_tenants:
        return scoped
    if spec.scope != "tenant":
        raise Forbidden(f"query {query!r} reads more than one tenant: it needs the admin or auditor role")
    tenants = identity.tenants
    if not tenants and REVIEWER in identity.roles and query in REVIEWER_QUERIES:
        return scoped  # a reviewer limited to no tenant reviews every tenant's requests
    if not tenants:
        raise Forbidden(f"query {query!r} needs the admin, auditor or a tenant:<id> role")
    given = scoped.get("tenant")
    # An empty tenant means "no filter" to the queries: for a tenant token it means its own tenant.
    if given is None or (isinstance(given, str) and not given.strip()):
        if len(tenants) > 1:
            raise QueryError(
                f"query {query!r}: this token reads tenants {', '.join(sorted(tenants))}; give tenant= one of them",
                query=query,
                param="tenant",
            )
        (scoped["tenant"],) = tenants
    elif isinstance(given, str) and given in tenants:
        scoped["tenant"] = given
    else:
        raise Forbidden(f"this token may not read tenant {given!r}; it reads {', '.join(sorted(tenants))}")
    return scoped


def hash_token(token: str) -> str:
    """The SHA-256 hex digest a token file stores for `token`."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


# -- the token file ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TokenEntry:
    """One token of a token file: who it is, the SHA-256 hex of the token, its roles."""

    subject: str
    sha256: str
    roles: tuple[str, ...]
    created: str | None = None
    """When `callgate token new` issued it (ISO 8601), for rotation; informational."""

    def to_yaml(self) -> dict[str, Any]:
        """The entry as the file holds it."""
        data: dict[str, Any] = {"subject": self.subject, "sha256": self.sha256, "roles": list(self.roles)}
        if self.created is not None:
            data["created"] = self.created
        return data


_ENTRY_KEYS = frozenset({"subject", "sha256", "roles", "created"})


def parse_token_file(text: str, *, source: str) -> list[TokenEntry]:
    """The entries of a token file's text (`source` names it in messages). An empty text is an empty
    file. Raises `ConfigError` naming the entry and field for anything malformed: not YAML, no
    `tokens` list, an unknown key, an empty subject, a hash that is not 64 lowercase hex digits, a
    duplicate subject or hash, no roles or an unknown role."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not YAML: {exc}") from None
    if data is None:
        return []
    if not isinstance(data, dict) or set(data) - {"tokens"}:
        raise ConfigError(f"{source}: expected a mapping with one key, tokens: [{{subject, sha256, roles}}, ...]")
    items = data.get("tokens") or []
    if not isinstance(items, list):
        raise ConfigError(f"{source}: tokens must be a list")
    entries: list[TokenEntry] = []
    subjects: set[str] = set()
    hashes: set[str] = set()
    for number, item in enumerate(items, 1):
        where = f"{source}: token {number}"
        if not isinstance(item, dict):
            raise ConfigError(f"{where}: expected a mapping with subject, sha256, roles")
        unknown = sorted(set(map(str, item)) - _ENTRY_KEYS)
        if unknown:
            raise ConfigError(f"{where}: unknown key {unknown[0]!r} (keys: subject, sha256, roles, created)")
        subject, digest, roles = item.get("subject"), item.get("sha256"), item.get("roles")
        if not isinstance(subject, str) or not subject.strip():
            raise ConfigError(f"{where}: subject must be a non-empty text")
        where = f"{source}: token {number} ({subject})"
        if not isinstance(digest, str) or not _HEX64.fullmatch(digest):
            raise ConfigError(f"{where}: sha256 must be 64 lowercase hex digits (the token's SHA-256, never the token)")
        if not isinstance(roles, list) or not roles or not all(isinstance(role, str) for role in roles):
            raise ConfigError(f"{where}: roles must be a non-empty list of admin, auditor or tenant:<id>")
        try:
            checked = tuple(parse_role(role) for role in roles)
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        if subject in subjects:
            raise ConfigError(f"{where}: subject {subject!r} appears twice")
        if digest in hashes:
            raise ConfigError(f"{where}: the same token hash appears twice")
        created = item.get("created")
        subjects.add(subject)
        hashes.add(digest)
        entries.append(TokenEntry(subject, digest, checked, None if created is None else str(created)))
    return entries


class TokenFile:
    """An `Authenticator` over a token file, read again whenever it changes.

    Each `authenticate` stats the file (microseconds) and reads it again when its modification time,
    size or inode moved, so `callgate token new|revoke` takes effect on the next request without a
    restart. A file that can no longer be read or parsed fails closed: every token is refused
    (logged) until it is fixed. Hashes are compared with `hmac.compare_digest`, against every entry.

    Raises `ConfigError` from the constructor when the file is missing or malformed.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._signature: tuple[int, int, int] | None = None
        self._entries: list[tuple[str, Identity]] = []
        self._error: str | None = None
        try:
            stat = self.path.stat()
            text = self.path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read token file {self.path}: {exc.strerror or exc}") from None
        self._load(text, (stat.st_mtime_ns, stat.st_size, stat.st_ino))
        if self._error is not None:
            raise ConfigError(self._error)

    def _load(self, text: str, signature: tuple[int, int, int]) -> None:
        try:
            entries = parse_token_file(text, source=str(self.path))
        except ConfigError as exc:
            self._entries, self._error = [], str(exc)
        else:
            self._entries = [(e.sha256, Identity(e.subject, frozenset(e.roles))) for e in entries]
            self._error = None
        self._signature = signature

    def _refresh(self) -> None:
        try:
            stat = os.stat(self.path)
        except OSError as exc:
            signature = (-1, -1, -1)
            if signature != self._signature:
                log.error("token file %s cannot be read (%s): refusing every token", self.path, exc.strerror)
                self._entries, self._error, self._signature = [], f"token file {self.path} is gone", signature
            return
        signature = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        if signature == self._signature:
            return
        with self._lock:
            if signature == self._signature:
                return
            try:
                text = self.path.read_text(encoding="utf-8")
            except OSError as exc:
                text = None
                self._entries, self._error = [], f"cannot read token file {self.path}: {exc.strerror}"
                self._signature = signature
            if text is not None:
                self._load(text, signature)
            if self._error is not None:
                log.error("%s: refusing every token until it is fixed", self._error)
            else:
                log.info("token file %s read again: %d tokens", self.path, len(self._entries))

    @property
    def subjects(self) -> list[str]:
        """The subjects of the tokens as last read."""
        self._refresh()
        return [identity.subject for _, identity in self._entries]

    def authenticate(self, token: str) -> Identity:
        """The identity whose hash matches `token`; `AuthError` for an unknown token or an unusable file."""
        self._refresh()
        entries = self._entries
        digest = hash_token(token)
        found: Identity | None = None
        for stored, identity in entries:
            if hmac.compare_digest(stored, digest):
                found = identity
        if found is None:
            raise AuthError("unknown token")
        return found


# -- OIDC bearer tokens --------------------------------------------------------------------------

ASYMMETRIC_ALGORITHMS: Final = (
    "RS256",
    "RS384",
    "RS512",
    "PS256",
    "PS384",
    "PS512",
    "ES256",
    "ES384",
    "ES512",
    "EdDSA",
)
"""The JWT algorithms accepted: public-key signatures only (never "none" or a shared secret)."""

_KEY_TYPE: Final = {"RS": "RSA", "PS": "RSA", "ES": "EC", "Ed": "OKP"}
"""The JWK key type (`kty`) each algorithm family signs with."""


class JwtAuthenticator:
    """An `Authenticator` for OIDC bearer tokens (JWTs), checked with pyjwt.

    `jwks` is a JWKS file (read again when it changes) or an http(s) URL (fetched with pyjwt's
    `PyJWKClient`, cached for `jwks_cache_s` and fetched again for an unknown key id, at most once
    per `jwks_refetch_s`, so tokens with made-up key ids cannot make it hammer the URL). A token is
    accepted when its signature verifies with the JWKS key its header names (`kid`; without one, the
    only key), by an algorithm of `ASYMMETRIC_ALGORITHMS`, and it carries `exp` (not past, give or
    take `leeway_s`), `aud` containing `audience`, `iss` equal to `issuer` and `sub` (the subject).
    Roles come from the claim `roles_claim` (a dotted path such as `realm_access.roles` reaches into
    nested objects): a list of texts or one space-separated text; roles this code does not know are
    ignored. Raises `ConfigError` from the constructor for an unusable JWKS file or setting.
    """

    def __init__(
        self,
        jwks: str,
        *,
        audience: str,
        issuer: str,
        roles_claim: str = "roles",
        leeway_s: float = 30.0,
        jwks_cache_s: float = 300.0,
        jwks_refetch_s: float = 30.0,
        timeout_s: float = 10.0,
    ) -> None:
        import jwt

        if not audience or not issuer:
            raise ConfigError("JWT checks need both an audience and an issuer")
        if not roles_claim or any(not part for part in roles_claim.split(".")):
            raise ConfigError(f"the roles claim must be a claim name or a dotted path, got {roles_claim!r}")
        self.jwks = jwks
        self.audience = audience
        self.issuer = issuer
        self.roles_claim = roles_claim
        self.leeway_s = leeway_s
        self._lock = threading.Lock()
        self._client: jwt.PyJWKClient | None = None
        self._file: Path | None = None
        self._keys: list[jwt.PyJWK] = []
        self._signature: tuple[int, int, int] | None = None
        if jwks.startswith(("http://", "https://")):
            self._client = jwt.PyJWKClient(
                jwks, lifespan=jwks_cache_s, timeout=timeout_s, cooldown_duration=jwks_refetch_s
            )
        else:
            self._file = Path(jwks)
            try:
                stat = self._file.stat()
                self._keys = self._read_keys(self._file.read_text(encoding="utf-8"))
            except OSError as exc:
                raise ConfigError(f"cannot read JWKS file {jwks}: {exc.strerror or exc}") from None
            self._signature = (stat.st_mtime_ns, stat.st_size, stat.st_ino)

    def _read_keys(self, text: str) -> list[Any]:
        import jwt

        try:
            keys = jwt.PyJWKSet.from_json(text).keys
        except (jwt.PyJWKSetError, jwt.InvalidKeyError, ValueError) as exc:
            raise ConfigError(f"JWKS {self.jwks}: {exc}") from None
        return list(keys)

    def _file_keys(self, path: Path) -> list[Any]:
        try:
            stat = path.stat()
        except OSError:
            return []
        signature = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        if signature != self._signature:
            with self._lock:
                if signature != self._signature:
                    try:
                        self._keys = self._read_keys(path.read_text(encoding="utf-8"))
                    except (OSError, ConfigError) as exc:
                        log.error("JWKS file %s cannot be used (%s): refusing every token", path, exc)
                        self._keys = []
                    self._signature = signature
        return self._keys

    def _signing_key(self, token: str, kid: str | None) -> Any:
        import jwt

        if self._client is not None:
            try:
                if kid is None:
                    keys = self._client.get_signing_keys()
                    if len(keys) != 1:
                        raise AuthError("the token names no key id (kid) and the JWKS holds several keys")
                    return keys[0]
                return self._client.get_signing_key(kid)
            except (jwt.PyJWKClientError, jwt.PyJWKError) as exc:
                raise AuthError(f"no signing key for the token: {exc}") from None
        keys = self._file_keys(self._file) if self._file is not None else []
        if kid is None:
            if len(keys) != 1:
                raise AuthError("the token names no key id (kid) and the JWKS holds several keys")
            return keys[0]
        for key in keys:
            if key.key_id == kid:
                return key
        raise AuthError(f"no key {kid!r} in the JWKS")

    def authenticate(self, token: str) -> Identity:
        """The token's `sub` and roles; `AuthError` saying what failed (signature, expiry, audience,
        issuer, a missing claim)."""
        import jwt

        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError as exc:
            raise AuthError(f"not a JWT: {exc}") from None
        algorithm = header.get("alg")
        if algorithm not in ASYMMETRIC_ALGORITHMS:
            raise AuthError(f"JWT algorithm {algorithm!r} is not accepted (public-key signatures only)")
        kid = header.get("kid")
        key = self._signing_key(token, kid if isinstance(kid, str) else None)
        if key.key_type != _KEY_TYPE[algorithm[:2]]:
            # A key of another type cannot check the signature at all (pyjwt raises TypeError there).
            named = "its only key" if kid is None else f"its key {kid!r}"
            raise AuthError(f"the token is signed with {algorithm} but {named} is a {key.key_type} key")
        try:
            claims = jwt.decode(
                token,
                key.key,
                algorithms=[algorithm],
                audience=self.audience,
                issuer=self.issuer,
                leeway=self.leeway_s,
                options={"require": ["exp", "aud", "iss", "sub"]},
            )
        except jwt.ExpiredSignatureError:
            raise AuthError("the token has expired") from None
        except jwt.InvalidAudienceError:
            raise AuthError("the token is not meant for this audience") from None
        except jwt.InvalidIssuerError:
            raise AuthError("the token comes from another issuer") from None
        except jwt.InvalidTokenError as exc:
            raise AuthError(f"invalid token: {exc}") from None
        subject = claims.get("sub")
        if not isinstance(subject, str) or not subject:
            raise AuthError("the token's sub claim is empty")
        return Identity(subject, frozenset(_known_roles(_claim(claims, self.roles_claim))))


def _claim(claims: Mapping[str, Any], path: str) -> Any:
    value: Any = claims
    for part in path.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def _known_roles(value: Any) -> list[str]:
    items: Sequence[Any] = value.split() if isinstance(value, str) else value if isinstance(value, list) else []
    roles = []
    for item in items:
        if isinstance(item, str):
            try:
                roles.append(parse_role(item))
            except ValueError:
                continue  # an identity provider's other roles grant nothing here
    return roles


class AuthenticatorChain:
    """An `Authenticator` asking each of `authenticators` in turn: the first identity wins; when all
    refuse, the last one's `AuthError` is raised."""

    def __init__(self, *authenticators: Authenticator) -> None:
        if not authenticators:
            raise ConfigError("an authenticator chain needs at least one authenticator")
        self.authenticators = authenticators

    def authenticate(self, token: str) -> Identity:
        """See the class docstring."""
        error = AuthError("unknown token")
        for authenticator in self.authenticators:
            try:
                return authenticator.authenticate(token)
            except AuthError as exc:
                error = exc
        raise error
