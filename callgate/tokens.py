"""`callgate token new|revoke|list`: the read API's token file (`callgate materialize --auth FILE`).

The file holds each token's SHA-256 only, never the token: `new` prints the token once, on stdout
alone (so `TOKEN=$(callgate token new ...)` captures it), and the file cannot give it back. The file
is written whole to a temporary file beside it (mode 0600) and moved over it, so a read API reading
it again never sees half of it. Errors exit 2 with one line naming the file, subject or role.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import tempfile
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
import yaml

if TYPE_CHECKING:
    # consumers loads DuckDB: imported where used, so `callgate --help` does not.
    from consumers.auth import TokenEntry

__all__ = ["TokenFileError", "add_token", "app", "new_token_text", "read_entries", "revoke_token", "write_entries"]

app = typer.Typer(
    help="Issue and revoke the read API's bearer tokens (a token file for callgate materialize --auth).",
    no_args_is_help=True,
    add_completion=False,
)

TOKEN_PREFIX = "cg_"  # noqa: S105 (a prefix that marks callgate tokens, not a secret)


class TokenFileError(Exception):
    """What `token new|revoke` refuse: an unreadable or malformed file, a duplicate or unknown subject,
    an unknown role. The message names the culprit."""


def new_token_text() -> str:
    """A new random token: "cg_" and 43 URL-safe characters (256 bits)."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def read_entries(path: Path) -> list[TokenEntry]:
    """The file's entries; none for a missing file. Raises `TokenFileError` for a file that cannot be
    read or parsed."""
    from consumers.auth import ConfigError, parse_token_file

    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise TokenFileError(f"cannot read {path}: {exc.strerror}") from None
    try:
        return parse_token_file(text, source=str(path))
    except ConfigError as exc:
        raise TokenFileError(str(exc)) from None


def write_entries(path: Path, entries: Sequence[TokenEntry]) -> None:
    """Replace the file with `entries`, mode 0600, atomically (a temporary file moved over it)."""
    text = "# callgate read API tokens: SHA-256 hashes only (callgate token new|revoke).\n" + yaml.safe_dump(
        {"tokens": [entry.to_yaml() for entry in entries]}, sort_keys=False
    )
    directory = path.parent if str(path.parent) else Path(".")
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=directory)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


# Characters a reader of a role takes for a separator or a wildcard: `tenant:a,b` looks like two
# tenants and `tenant:*` like all of them, though each is one tenant of that odd name.
_AMBIGUOUS_IN_TENANT = re.compile(r"[\s,;*?%|\[\]{}\"'\\]")


def add_token(path: Path, subject: str, roles: Sequence[str], *, now: datetime | None = None) -> str:
    """Add a new token for `subject` with `roles` to the file (created if missing) and return the
    token. Raises `TokenFileError` for a duplicate subject, no role, an unknown role or a bad file."""
    from consumers.auth import TokenEntry, hash_token, parse_role

    if not subject.strip():
        raise TokenFileError("the subject must not be empty")
    if not roles:
        raise TokenFileError("give at least one --role: admin, auditor, reviewer or tenant:<id>")
    try:
        checked = tuple(dict.fromkeys(parse_role(role) for role in roles))
    except ValueError as exc:
        raise TokenFileError(str(exc)) from None
    for role in checked:
        if role.startswith("tenant:") and (odd := _AMBIGUOUS_IN_TENANT.search(role, len("tenant:"))):
            raise TokenFileError(
                f"role {role!r}: a tenant id with {odd.group()!r} reads as a list or a pattern, and a role names "
                "one tenant exactly; give one --role tenant:<id> per tenant, each id without spaces, commas or "
                "wildcards"
            )
    entries = read_entries(path)
    if any(entry.subject == subject for entry in entries):
        raise TokenFileError(
            f"{path} already has a token for subject {subject!r}: revoke it first, or issue one under a new subject"
        )
    token = new_token_text()
    created = (now or datetime.now(UTC)).replace(microsecond=0).isoformat()
    write_entries(path, [*entries, TokenEntry(subject, hash_token(token), checked, created)])
    return token


def revoke_token(path: Path, subject: str) -> None:
    """Remove `subject`'s token from the file. Raises `TokenFileError` when the file or the subject
    is not there."""
    if not path.exists():
        raise TokenFileError(f"no token file at {path}")
    entries = read_entries(path)
    kept = [entry for entry in entries if entry.subject != subject]
    if len(kept) == len(entries):
        raise TokenFileError(f"{path} has no token for subject {subject!r}")
    write_entries(path, kept)


FileOption = Annotated[Path, typer.Option("--file", help="The token file (callgate materialize --auth FILE).")]


def _fail(exc: Exception) -> typer.Exit:
    typer.echo(f"error: {exc}", err=True)
    return typer.Exit(2)


@app.command("new")
def new_command(
    file: FileOption,
    subject: Annotated[str, typer.Option(help="Who the token is for (shown in the access log).")],
    role: Annotated[
        list[str], typer.Option("--role", help="admin, auditor, reviewer or tenant:<id>; repeat for several.")
    ],
) -> None:
    """Add a token to the file (created mode 0600 if missing) and print it once, on stdout."""
    try:
        token = add_token(file, subject, role)
    except (TokenFileError, OSError) as exc:
        raise _fail(exc) from None
    typer.echo(token)
    typer.echo(
        f"added {subject!r} ({', '.join(dict.fromkeys(role))}) to {file}; the token above is shown only this once",
        err=True,
    )


@app.command("revoke")
def revoke_command(
    file: FileOption,
    subject: Annotated[str, typer.Option(help="Whose token to remove.")],
) -> None:
    """Remove a subject's token; a read API using the file refuses it from its next request."""
    try:
        revoke_token(file, subject)
    except (TokenFileError, OSError) as exc:
        raise _fail(exc) from None
    typer.echo(f"revoked {subject!r} in {file}", err=True)


@app.command("list")
def list_command(file: FileOption) -> None:
    """The subjects, roles and issue times in the file (never a token: the file holds none)."""
    try:
        entries = read_entries(file)
    except TokenFileError as exc:
        raise _fail(exc) from None
    for entry in entries:
        typer.echo(f"{entry.subject}\t{','.join(entry.roles)}\t{entry.created or ''}")
