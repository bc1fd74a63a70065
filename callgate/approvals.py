"""`callgate approvals list|show|approve|deny`: approval requests, decided from the command line.

`list` and `show` read the named queries `pending_approvals` and `approval_request` from a read API
(`--api`, with a token) or a store file nobody writes (`--db`). `approve` and `deny` go through the
read API's write route only: a decision names the reviewer's authenticated subject (the token's),
and needs the `reviewer` role. Errors exit 2 with one line; a refused decision exits 1 with the
API's reason (not a reviewer, another tenant's request, one's own request, decided or expired).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

__all__ = ["app"]

app = typer.Typer(
    help="List, show, approve and deny approval requests (reviewers; decisions need the read API and role reviewer).",
    no_args_is_help=True,
    add_completion=False,
)

ApiOption = Annotated[str | None, typer.Option(help="A running materializer's read API, http://HOST:PORT.")]
DbOption = Annotated[Path | None, typer.Option(help="An audit store file nobody is writing (read only).")]
TokenOption = Annotated[
    str | None,
    typer.Option(envvar="CALLGATE_TOKEN", show_envvar=True, help="The read API's bearer token."),
]
TenantOption = Annotated[str | None, typer.Option(help="Only this tenant's requests.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
NoteOption = Annotated[str | None, typer.Option(help="A note for the record (the model reads it on a denial).")]


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


def _rows(query: str, params: dict[str, Any], api: str | None, db: Path | None, token: str | None) -> list[Any]:
    from consumers.queries import QueryError
    from consumers.reader import SourceUnavailableError, open_reader

    try:
        reader = open_reader(api=api, db=db, token=token)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    try:
        return list(reader.query(query, {k: v for k, v in params.items() if v is not None}).rows)
    except (QueryError, SourceUnavailableError) as exc:
        raise _fail(str(exc)) from None
    finally:
        reader.close()


@app.command("list")
def list_requests(
    api: ApiOption = None,
    db: DbOption = None,
    token: TokenOption = None,
    tenant: TenantOption = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="How many at most.")] = 100,
    as_json: JsonOption = False,
) -> None:
    """The pending requests, newest first."""
    rows = _rows("pending_approvals", {"tenant": tenant, "limit": limit}, api, db, token)
    if as_json:
        typer.echo(json.dumps(rows, indent=2, default=str))
        return
    table = Table("approval id", "requested", "expires", "tenant", "principal", "tool", "rule", "reason")
    for row in rows:
        table.add_row(
            row["approval_id"],
            str(row["requested_at"]),
            str(row["expires_at"]),
            str(row["tenant"]),
            str(row["principal"]),
            str(row["tool"]),
            str(row["rule"] or ""),
            str(row["reason"]),
        )
    Console().print(table)
    typer.echo(f"{len(rows)} pending")


@app.command()
def show(
    approval_id: Annotated[str, typer.Argument(help="The request's approval id.")],
    api: ApiOption = None,
    db: DbOption = None,
    token: TokenOption = None,
) -> None:
    """One request: what it asks (tool, redacted args, rule, run), its status and decision and, once its
    approved call ran, who claimed it (claimed_at, claimant, claimed_by); exit 1 if there is none."""
    rows = _rows("approval_request", {"approval_id": approval_id}, api, db, token)
    if not rows:
        typer.echo(f"no approval request {approval_id!r}", err=True)
        raise typer.Exit(1)
    typer.echo(json.dumps(rows[0], indent=2, default=str))


def _decide(approval_id: str, approved: bool, api: str | None, token: str | None, note: str | None) -> None:
    from consumers.approvals import post_decision

    if api is None:
        raise _fail("deciding needs the read API: give --api http://HOST:PORT and a reviewer's --token")
    try:
        status, body = post_decision(api, approval_id, approved=approved, note=note, token=token)
    except (OSError, ValueError) as exc:
        raise _fail(f"cannot reach the read API at {api}: {exc}") from None
    if status != 200:
        typer.echo(f"refused ({status}): {body.get('error', body)}", err=True)
        raise typer.Exit(1)
    typer.echo(f"{body['approval_id']} {'approved' if approved else 'denied'} by {body['by']}")


@app.command()
def approve(
    approval_id: Annotated[str, typer.Argument(help="The request's approval id.")],
    api: ApiOption = None,
    token: TokenOption = None,
    note: NoteOption = None,
) -> None:
    """Approve a pending request (as the token's subject; role reviewer)."""
    _decide(approval_id, True, api, token, note)


@app.command()
def deny(
    approval_id: Annotated[str, typer.Argument(help="The request's approval id.")],
    api: ApiOption = None,
    token: TokenOption = None,
    note: NoteOption = None,
) -> None:
    """Deny a pending request (as the token's subject; role reviewer)."""
    _decide(approval_id, False, api, token, note)
