#!/usr/bin/env node
// A verifier of callgate event chains that shares no code with callgate: it needs only the rules
// of docs/events.md ("Verifying a chain without callgate") and Node.js's own crypto module.
//
//   node docs/verify_chain.mjs events.jsonl [more.jsonl ...]
//
// Reads JSONL files written by callgate's JsonlSink (one event per line, as the producer wrote
// it), checks every schema_version 2 event's hash over its bytes and every producer's chain
// (seq 1, 2, 3 ... without gaps, each prev_hash the hash of the event before), and prints one
// JSON report. Exit status: 0 when every chain is whole and untampered, 1 when not, 2 when a file
// cannot be read. Version 1 events (hashed over a canonical JSON that needs Python's number
// formatting) are counted as `unverified`, never as good.

import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";

const ZERO = "0".repeat(64);
const SUFFIX_BYTES = 75; // ,"hash":"<64 hex>"}
const SUFFIX = /^,"hash":"([0-9a-f]{64})"\}$/;

function verifyLine(line) {
  // The hash is the wire's last member: cut it off, put the closing brace back, hash the rest.
  if (line.length <= SUFFIX_BYTES) return { error: "too short to carry a hash" };
  const match = SUFFIX.exec(line.subarray(line.length - SUFFIX_BYTES).toString("latin1"));
  if (match === null) return { error: "does not end with the hash member" };
  const body = Buffer.concat([line.subarray(0, line.length - SUFFIX_BYTES), Buffer.from("}")]);
  let event;
  let fields;
  try {
    event = JSON.parse(line.toString("utf8"));
    fields = JSON.parse(body.toString("utf8"));
  } catch (err) {
    return { error: `not JSON: ${err.message}` };
  }
  if (Object.hasOwn(fields, "hash")) return { event, error: "the body carries a second hash member" };
  const actual = createHash("sha256").update(body).digest("hex");
  return { event, claimed: match[1], actual };
}

function main(paths) {
  const producers = new Map(); // producer_id -> Map(seq -> {hash, prev_hash, event_id})
  const seenIds = new Map(); // event_id -> hash
  const tampered = [];
  const duplicates = [];
  let events = 0;
  let unverified = 0;
  for (const path of paths) {
    let data;
    try {
      data = readFileSync(path);
    } catch (err) {
      console.error(`cannot read ${path}: ${err.message}`);
      process.exit(2);
    }
    let start = 0;
    let number = 0;
    while (start < data.length) {
      let end = data.indexOf(0x0a, start);
      if (end === -1) end = data.length;
      const line = data.subarray(start, end);
      start = end + 1;
      number += 1;
      if (line.length === 0) continue;
      events += 1;
      const where = `${path}:${number}`;
      const result = verifyLine(line);
      const event = result.event;
      if (event !== undefined && event.schema_version === 1) {
        unverified += 1;
        continue;
      }
      if (result.error !== undefined) {
        tampered.push({ line: where, producer_id: event?.producer_id ?? null, seq: event?.seq ?? null, reason: result.error });
        continue;
      }
      if (event.schema_version !== 2) {
        tampered.push({ line: where, producer_id: event.producer_id, seq: event.seq, reason: `unknown schema_version ${event.schema_version}` });
        continue;
      }
      if (seenIds.has(event.event_id)) {
        if (seenIds.get(event.event_id) === result.actual) duplicates.push(event.event_id);
        else tampered.push({ line: where, producer_id: event.producer_id, seq: event.seq, reason: "conflicting duplicate of the same event id" });
        continue;
      }
      seenIds.set(event.event_id, result.actual);
      if (result.actual !== result.claimed) {
        tampered.push({ line: where, producer_id: event.producer_id, seq: event.seq, reason: "hash does not match the content" });
      }
      if (!producers.has(event.producer_id)) producers.set(event.producer_id, new Map());
      const chain = producers.get(event.producer_id);
      if (chain.has(event.seq)) {
        tampered.push({ line: where, producer_id: event.producer_id, seq: event.seq, reason: `conflicts with event ${chain.get(event.seq).event_id} at the same seq` });
        continue;
      }
      chain.set(event.seq, { hash: result.claimed, prev_hash: event.prev_hash, event_id: event.event_id, line: where });
    }
  }
  const gaps = {};
  const tops = {};
  for (const [producer, chain] of producers) {
    const top = Math.max(...chain.keys());
    tops[producer] = top;
    const missing = [];
    for (let seq = 1; seq <= top; seq += 1) {
      const entry = chain.get(seq);
      if (entry === undefined) {
        missing.push(seq);
        continue;
      }
      const before = seq === 1 ? { hash: ZERO } : chain.get(seq - 1);
      if (before !== undefined && entry.prev_hash !== before.hash) {
        tampered.push({ line: entry.line, producer_id: producer, seq, reason: "prev_hash does not link to the previous event" });
      }
    }
    if (missing.length > 0) gaps[producer] = missing;
  }
  const ok = tampered.length === 0 && Object.keys(gaps).length === 0;
  console.log(JSON.stringify({ ok, events, unverified, producers: tops, gaps, tampered, duplicates }));
  process.exit(ok ? 0 : 1);
}

if (process.argv.length < 3) {
  console.error("usage: node verify_chain.mjs FILE.jsonl [FILE.jsonl ...]");
  process.exit(2);
}
main(process.argv.slice(2));
