"""Provable audit's figures: what verifying checkpoints costs the store, and how fast it answers proofs.

    python bench/proofs.py [--events N] [--ingest-events M] [--rounds R] [--proofs K]

Every stream is a real gate's: `desk.call` of an inline tool (`bench/gate_overhead.py`), one
`ToolUse` event per call, with a signing key at the default cadence (a `Checkpoint` every 1,000
events or 5 s, and the closing one) or without a key; its wire bytes go to the store as Kafka
records, in batches of 10,000.

1. Ingest (`AuditStore.ingest`, µs per event) of M events (default 20,000) into a fresh store file,
   rounds of all four in an order shuffled each round, medians over R rounds (default 5), and the
   medians of the per-round ratios to the floor (ingest is noisy on a shared machine):
   - floor: the gate without a key (no checkpoints: nothing to fold, nothing to verify);
   - signed, no `trusted_keys`: the store still folds a signed producer's events into its tree
     index (`consumers.proofs.fold`), so this minus the floor is the fold's cost;
   - `trusted_keys` (`callgate materialize --trusted-keys`): every checkpoint verified (signature,
     root from the index, consistency with the one before): this minus the last is verification's;
   - `trusted_keys` and `require_signed`.
2. Proofs over one signed producer of N events (default 200,000; docs/performance.md records
   `--events 1000000`): the store is built as above, with trusted keys; then for K random events
   (default 200) through `open_reader(db=...)`: the named query `inclusion_material`, then
   `consumers.proofs.build_proof`, then `events.proofs.check_proof` with the public key (each must
   be valid). Median and p99 ms, against the contrast of `events.merkle.inclusion_proof` over all N
   leaf hashes in memory (O(n) hashing: what a store without its index would have to do), for a
   few events. And the store's `merkle_nodes` row count.

The last lines are the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from figures import report

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gate_overhead import ARGS, RUN, AllowTenant, build_desk, get_order_inline

from consumers.proofs import MATERIAL_QUERY, build_proof
from consumers.reader import open_reader
from consumers.store import AuditStore, RawRecord
from events.chain import SealedEvent
from events.merkle import inclusion_proof, leaf_hash
from events.proofs import check_proof
from events.signing import SigningKey, VerifyingKey

TOPIC = "callgate.audit"
BATCH = 10_000


class Records:
    """A sink that keeps each event as the Kafka record a `KafkaSink` would have sent (key, value)."""

    def __init__(self) -> None:
        self.records: list[RawRecord] = []
        self.offset = 0

    def emit(self, event: SealedEvent) -> None:
        self.records.append(RawRecord(TOPIC, 0, self.offset, event.producer_id.encode(), event.data, 0))
        self.offset += 1

    def take(self) -> list[RawRecord]:
        out, self.records = self.records, []
        return out


class Stream:
    """A gate (signed or not) whose calls are turned into batches of records on demand."""

    def __init__(self, key: SigningKey | None) -> None:
        self.sink = Records()
        self.desk = build_desk(AllowTenant, 1, [self.sink], [get_order_inline], key)

    async def batch(self, calls: int) -> list[RawRecord]:
        for _ in range(calls):
            await self.desk.call("get_order", ARGS, run=RUN)
        return self.sink.take()

    async def close(self) -> list[RawRecord]:
        await self.desk.gate.close()
        return self.sink.take()


async def stream_batches(key: SigningKey | None, events: int) -> list[list[RawRecord]]:
    """The records of a gate's `events` calls (and its closing checkpoint), in batches of `BATCH`."""
    stream = Stream(key)
    batches = []
    for start in range(0, events, BATCH):
        batches.append(await stream.batch(min(BATCH, events - start)))
    batches[-1].extend(await stream.close())
    return batches


def ingest_all(store: AuditStore, batches: list[list[RawRecord]]) -> float:
    """Seconds spent in `ingest` for every batch (offsets committed with each)."""
    spent = 0.0
    for records in batches:
        started = time.perf_counter()
        result = store.ingest(records, {(TOPIC, 0): records[-1].offset + 1})
        spent += time.perf_counter() - started
        if result.chain_breaks_by_kind:
            raise SystemExit(f"bench setup is wrong: chain breaks {dict(result.chain_breaks_by_kind)}")
    return spent


def ingest_costs(events: int, rounds: int, key: SigningKey, tmp: Path) -> dict[str, list[float]]:
    """µs per event of ingest, per variant and round (variants in turn within each round)."""
    trusted = {key.key_id: key.public()}
    plain = asyncio.run(stream_batches(None, events))
    signed = asyncio.run(stream_batches(key, events))
    variants: dict[str, tuple[list[list[RawRecord]], Callable[[Path], AuditStore]]] = {
        "no key (floor)": (plain, lambda p: AuditStore(p)),
        "signed, no trusted_keys (fold)": (signed, lambda p: AuditStore(p)),
        "signed, trusted_keys": (signed, lambda p: AuditStore(p, trusted_keys=trusted)),
        "signed, trusted_keys + require_signed": (
            signed,
            lambda p: AuditStore(p, trusted_keys=trusted, require_signed=True),
        ),
    }
    # The first store a process opens pays for DuckDB's and the store's one-off setup: not ingest.
    for i, (batches, open_store) in enumerate(variants.values()):
        with open_store(tmp / f"warm-{i}.duckdb") as store:
            ingest_all(store, batches[:1])
    samples: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    shuffle = random.Random(18).shuffle
    for r in range(rounds):
        shuffle(names)
        for i, name in enumerate(names):
            batches, open_store = variants[name]
            path = tmp / f"ingest-{r}-{i}.duckdb"
            with open_store(path) as store:
                seconds = ingest_all(store, batches)
            path.unlink()
            stored = sum(len(b) for b in batches)
            samples[name].append(seconds / stored * 1e6)
    return samples


async def build_store(path: Path, key: SigningKey, events: int, samples: int) -> tuple[list[str], list[bytes], float]:
    """A store of one signed producer's `events` calls; (random event ids to prove, every event
    hash in seq order, seconds it took)."""
    started = time.perf_counter()
    wanted = set(random.Random(7).sample(range(events), samples))
    chosen: list[str] = []
    hashes: list[bytes] = []
    stream = Stream(key)
    with AuditStore(path, trusted_keys={key.key_id: key.public()}) as store:
        done = 0
        while done < events:
            calls = min(BATCH, events - done)
            records = await stream.batch(calls)
            if done + calls >= events:
                records.extend(await stream.close())
            for record in records:
                assert record.value is not None
                hashes.append(bytes.fromhex(record.value[-66:-2].decode()))
                if record.offset in wanted and b'"type":"ToolUse"' in record.value:
                    chosen.append(record.value.split(b'"event_id":"', 1)[1][:36].decode())
            ingest_all(store, [records])
            done += calls
            if done % 100_000 == 0:
                print(f"  {done:,} events stored ({time.perf_counter() - started:.0f} s)", flush=True)
    return chosen, hashes, time.perf_counter() - started


def proof_times(path: Path, event_ids: list[str], public: VerifyingKey) -> tuple[list[float], list[float], int, int]:
    """ms per proof (query + build_proof) and per check (check_proof), each valid; the store's
    merkle_nodes and events row counts."""
    built_ms: list[float] = []
    check_ms: list[float] = []
    with open_reader(db=path) as reader:
        reader.query(MATERIAL_QUERY, {"event_id": event_ids[0]})  # opens the file: not a proof's cost
        for event_id in event_ids:
            started = time.perf_counter()
            rows = reader.query(MATERIAL_QUERY, {"event_id": event_id}).rows
            doc = build_proof(rows, event_id)
            built = time.perf_counter()
            if not isinstance(doc, dict):
                raise SystemExit(f"no proof of {event_id}: {doc}")
            verdict = check_proof(doc, public)
            checked = time.perf_counter()
            if not verdict.ok:
                raise SystemExit(f"the proof of {event_id} does not check: {verdict}")
            built_ms.append((built - started) * 1e3)
            check_ms.append((checked - built) * 1e3)
    with AuditStore(path, read_only=True) as store:
        con = store.cursor()
        (nodes,) = con.execute("SELECT count(*) FROM merkle_nodes").fetchall()[0]
        (stored,) = con.execute("SELECT count(*) FROM events").fetchall()[0]
        con.close()
    return built_ms, check_ms, int(nodes), int(stored)


def in_memory_proofs(hashes: list[bytes], count: int) -> list[float]:
    """ms per `inclusion_proof` over all leaf hashes (the O(n) contrast), for `count` random leaves."""
    leaves = [leaf_hash(h) for h in hashes]
    out = []
    for index in random.Random(11).sample(range(len(leaves)), count):
        started = time.perf_counter()
        inclusion_proof(leaves, index, len(leaves))
        out.append((time.perf_counter() - started) * 1e3)
    return out


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98] if len(values) >= 2 else values[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000, help="events of the proofs' store")
    parser.add_argument("--ingest-events", type=int, default=20_000, help="events of each ingest measurement")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the ingest measurement")
    parser.add_argument("--proofs", type=int, default=200, help="random events to prove")
    parser.add_argument("--contrast", type=int, default=3, help="in-memory O(n) proofs for the contrast")
    opts = parser.parse_args()
    key = SigningKey.generate("bench")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        costs = ingest_costs(opts.ingest_events, opts.rounds, key, tmp)
        med = {name: statistics.median(values) for name, values in costs.items()}
        floor = med["no key (floor)"]
        base = costs["no key (floor)"]
        paired = {name: statistics.median(v / b for v, b in zip(vs, base, strict=True)) for name, vs in costs.items()}
        title = f"ingest of {opts.ingest_events:,} events, in batches of {BATCH:,}"
        print(f"{title:<52} {'µs/event':>9} {'ratio':>7} {'per-round ratio':>16}")
        for name, us in med.items():
            print(f"  {name:<50} {us:>9.2f} {us / floor:>7.3f} {paired[name]:>16.3f}")
        fold_us = med["signed, no trusted_keys (fold)"] - floor
        verify_us = med["signed, trusted_keys"] - med["signed, no trusted_keys (fold)"]
        print(f"  the fold: {fold_us:.2f} µs/event; verification: {verify_us:.2f} µs/event (medians' differences)")

        path = tmp / "proofs.duckdb"
        print(f"\nbuilding a store of one signed producer with {opts.events:,} events ...", flush=True)
        chosen, hashes, build_s = asyncio.run(build_store(path, key, opts.events, opts.proofs))
        built_ms, check_ms, nodes, stored = proof_times(path, chosen, key.public())
        contrast_ms = in_memory_proofs(hashes, opts.contrast)
    proof_med, proof_p99 = statistics.median(built_ms), p99(built_ms)
    contrast = statistics.median(contrast_ms)
    print(f"  {stored:,} events stored in {build_s:.0f} s; merkle_nodes: {nodes:,} rows")
    print(f"{f'{len(chosen)} proofs over {stored:,} events':<52} {'median ms':>10} {'p99 ms':>8}")
    print(f"  {'inclusion_material + build_proof':<50} {proof_med:>10.2f} {proof_p99:>8.2f}")
    print(f"  {'check_proof (offline)':<50} {statistics.median(check_ms):>10.2f} {p99(check_ms):>8.2f}")
    print(f"  {f'contrast: inclusion_proof over {len(hashes):,} leaves':<50} {contrast:>10.1f}")

    print(f"\nverification: trusted_keys / no key = {med['signed, trusted_keys'] / floor:.2f} per event")
    print(f"proofs: median {proof_med:.1f} ms, p99 {proof_p99:.1f} ms over {stored:,} events (target: median <= 50 ms)")
    report("ingest, no key", floor, "µs/event", target="the floor")
    fold = med["signed, no trusted_keys (fold)"]
    report("ingest, signed (tree index fold)", fold, "µs/event", floor=floor, target="report")
    report(
        "ingest, --trusted-keys (fold + verify)", med["signed, trusted_keys"], "µs/event", floor=floor, target="report"
    )
    report(
        "ingest, --trusted-keys --require-signed",
        med["signed, trusted_keys + require_signed"],
        "µs/event",
        floor=floor,
        target="report",
    )
    report(
        f"inclusion proof over {stored:,} events, median",
        proof_med,
        "ms",
        floor=contrast,
        target="<= 50 ms (floor: O(n) in memory)",
    )
    report(f"inclusion proof over {stored:,} events, p99", proof_p99, "ms", target="report")
    report("check_proof, offline", statistics.median(check_ms), "ms", target="report")
    report(f"merkle_nodes rows for {stored:,} events", nodes, "rows", target="about n / 128")


if __name__ == "__main__":
    main()
