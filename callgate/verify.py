"""`callgate verify`: prove that one stored event is in its producer's signed chain, and check such a
proof offline.

`--db F | --api U --event ID` reads the rows of the named query `inclusion_material` (the event,
the latest `Checkpoint` of its producer that covers it, and the store's tree index nodes and hashes
its audit path needs: O(log n), `consumers.proofs`), builds the proof document and checks it.
`--proof P --key K` checks a proof document (`events.proofs`; docs/verify_proof.mjs does the same
in Node.js) with no store and no network.

Exit codes: 0 valid, 1 invalid (or not covered by any checkpoint), 2 cannot read (store, proof or
key).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from events.proofs import UnreadableProofError, Verdict, check_proof, load_proof
from events.signing import SigningError, VerifyingKey

EXIT_VALID = 0
EXIT_INVALID = 1
EXIT_CANNOT_READ = 2


Echo = Callable[[str], None]


# -- the commands ------------------------------------------------------------------------------


def run_build(
    *,
    db: Path | None,
    api: str | None,
    event_id: str,
    out: Path | None,
    echo: Echo,
    err: Echo,
    token: str | None = None,
) -> int:
    """`callgate verify --db F | --api U --event ID [--out P]`: build, check and print (or write) the
    proof; the exit code."""
    # Imported here: `callgate --help` must not load DuckDB.
    from consumers.proofs import MATERIAL_QUERY, build_proof
    from consumers.queries import QueryError
    from consumers.reader import SourceUnavailableError, open_reader

    if (api is None) == (db is None):
        err("error: give exactly one of --api URL (a running materializer) or --db FILE (an audit store)")
        return EXIT_CANNOT_READ
    try:
        reader = open_reader(api=api, db=db, token=token)
    except ValueError as exc:
        err(f"error: {exc}")
        return EXIT_CANNOT_READ
    try:
        rows = reader.query(MATERIAL_QUERY, {"event_id": event_id}).rows
    except SourceUnavailableError as exc:
        err(f"cannot read: {exc}")
        return EXIT_CANNOT_READ
    except QueryError as exc:
        err(f"cannot read: {reader.source} cannot answer the query {MATERIAL_QUERY} ({exc})")
        return EXIT_CANNOT_READ
    finally:
        reader.close()
    built = build_proof(rows, event_id)
    if isinstance(built, Verdict):
        err(f"no proof: {built.line()}")
        return EXIT_INVALID
    verdict = check_proof(built, None)
    text = json.dumps(built, indent=2, ensure_ascii=False) + "\n"
    if out is not None:
        try:
            out.write_text(text, encoding="utf-8")
        except OSError as exc:
            err(f"cannot write the proof: {out}: {exc.strerror or exc}")
            return EXIT_CANNOT_READ
    else:
        echo(text.rstrip("\n"))
    where = f" to {out}" if out is not None else ""
    summary = (
        f"proof of {event_id}{where}: event seq {built['seq']} of {built['producer_id']} "
        f"in checkpoint tree {built['tree_size']}"
    )
    if not verdict.ok:
        err(f"{summary}: {verdict.line()}")
        return EXIT_INVALID
    err(f"{summary}, root {built['root'][:16]}..: verifies (check it offline with --proof and the gate's key)")
    return EXIT_VALID


def run_check(*, proof: Path, key: Path, echo: Echo, err: Echo) -> int:
    """`callgate verify --proof P --key K`: the offline check; the exit code."""
    try:
        doc = load_proof(proof)
        verifying = VerifyingKey.load(key)
    except (UnreadableProofError, SigningError) as exc:
        err(f"cannot read: {exc}")
        return EXIT_CANNOT_READ
    verdict = check_proof(doc, verifying)
    (echo if verdict.ok else err)(f"proof {proof}: {verdict.line()}")
    return EXIT_VALID if verdict.ok else EXIT_INVALID
