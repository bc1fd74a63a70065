"""`callgate archive`: whole days of an audit store moved to Parquet (`consumers.archive`).

Exit codes: 0 done (also when no day was old enough), 2 cannot (the store is held by a running
materializer, cannot be opened, or the archive directory cannot be written; one line naming it).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

EXIT_OK = 0
EXIT_CANNOT = 2


def run_archive(
    *,
    db: Path,
    before: str,
    to: Path,
    dry_run: bool,
    echo: Callable[[str], None],
    err: Callable[[str], None],
) -> int:
    """Archive the days of `db` before `before` (ISO 8601 or a duration back from now: 30d) to `to`."""
    from callgate.replay import parse_time
    from consumers.archive import ArchivedDay, ArchiveError
    from consumers.store import AuditStore, StoreError, StoreLockedError

    try:
        cutoff = parse_time(before, "--before")
    except ValueError as exc:
        err(f"error: {exc}")
        return EXIT_CANNOT
    if cutoff is None:
        err("error: --before needs a time or a duration back from now (30d), not 'all'")
        return EXIT_CANNOT
    if not db.is_file():
        err(f"error: --db {db}: no such file")
        return EXIT_CANNOT
    try:
        store = AuditStore(db)
    except StoreLockedError as exc:
        err(f"error: {exc} (stop the materializer that holds it, archive, then start it again)")
        return EXIT_CANNOT
    except (StoreError, OSError) as exc:
        err(f"error: --db {db}: {exc}")
        return EXIT_CANNOT

    def moved(day: ArchivedDay) -> None:
        echo(f"{day.day.isoformat()}: {day.events:,} events -> {day.path}")

    with store:
        try:
            days = store.archive(before=cutoff, to=to, on_day=moved, dry_run=dry_run)
        except ArchiveError as exc:
            err(f"error: {exc}")
            return EXIT_CANNOT
    total = sum(day.events for day in days)
    if dry_run:
        for day in days:
            echo(f"{day.day.isoformat()}: {day.events:,} events would move")
        echo(f"dry run: {len(days)} day(s), {total:,} events before {cutoff.date().isoformat()} would move to {to}")
    else:
        echo(f"archived {len(days)} day(s), {total:,} events, to {to}")
    return EXIT_OK
