#!/usr/bin/env node
// Check a callgate inclusion proof offline, without callgate: node verify_proof.mjs PROOF.json KEY.pub
//
// The same steps as `callgate verify --proof P --key K` (callgate/verify.py), with node:crypto only:
// the event's hash from its bytes (version 2: SHA-256 of the wire without its last 75 bytes, `}` put
// back), its RFC 6962 leaf hash, the root from the audit path (RFC 9162 2.1.3.2), and the checkpoint's
// C2SP signed note opened with the gate's Ed25519 verifier key: origin callgate/<producer_id>, the
// proof's tree size and root. Exit 0 valid, 1 invalid (naming the step), 2 unreadable proof or key.

import { createHash, createPublicKey, verify } from "node:crypto";
import { readFileSync } from "node:fs";

const sha256 = (...parts) => {
  const hash = createHash("sha256");
  for (const part of parts) hash.update(part);
  return hash.digest();
};
const leafHash = (entry) => sha256(Buffer.from([0]), entry);
const nodeHash = (left, right) => sha256(Buffer.from([1]), left, right);
const hex32 = (text) => (typeof text === "string" && /^[0-9a-f]{64}$/.test(text) ? Buffer.from(text, "hex") : null);
const b64 = (text) => (/^[A-Za-z0-9+/]*={0,2}$/.test(text) && text.length % 4 === 0 ? Buffer.from(text, "base64") : null);

class Invalid extends Error {
  constructor(step, detail) {
    super(detail);
    this.step = step;
  }
}
class Unreadable extends Error {}

// -- reading the two files ------------------------------------------------------------------------

const FIELDS = {
  version: "number", event: "string", event_hash: "string", producer_id: "string", seq: "number",
  leaf_index: "number", tree_size: "number", leaf_hash: "string", audit_path: "array", checkpoint: "string",
  root: "string", note: "string", key_id: "string",
};

function loadProof(path) {
  let doc;
  try {
    doc = JSON.parse(readFileSync(path, "utf8"));
  } catch (error) {
    throw new Unreadable(`${path}: not a readable proof (${error.message})`);
  }
  if (doc === null || typeof doc !== "object" || Array.isArray(doc)) throw new Unreadable(`${path}: not a JSON object`);
  for (const [name, kind] of Object.entries(FIELDS)) {
    const ok = kind === "array" ? Array.isArray(doc[name]) : typeof doc[name] === kind;
    if (!ok || (kind === "number" && !Number.isSafeInteger(doc[name]))) {
      throw new Unreadable(`${path}: not a version 1 proof (field '${name}' missing or wrong)`);
    }
  }
  if (doc.version !== 1) throw new Unreadable(`${path}: proof version ${doc.version}, this verifier reads 1`);
  return doc;
}

function keyHash(name, raw) {
  return sha256(Buffer.from(name, "utf8"), Buffer.from([0x0a, 0x01]), raw).subarray(0, 4).toString("hex");
}

// "<name>+<key id hex>+<base64(0x01 || 32-byte key)>"
function loadKey(path) {
  let text;
  try {
    text = readFileSync(path, "utf8").trim();
  } catch (error) {
    throw new Unreadable(`${path}: cannot read the key file (${error.message})`);
  }
  const first = text.indexOf("+");
  const second = text.indexOf("+", first + 1);
  if (text.startsWith("PRIVATE+") || first < 1 || second < 0) throw new Unreadable(`${path}: not a verifier key`);
  const name = text.slice(0, first);
  const keyId = text.slice(first + 1, second).toLowerCase();
  const data = b64(text.slice(second + 1));
  if (data === null || data.length !== 33 || data[0] !== 0x01) throw new Unreadable(`${path}: not an Ed25519 verifier key`);
  const raw = data.subarray(1);
  if (keyHash(name, raw) !== keyId) throw new Unreadable(`${path}: key id ${keyId} does not match the key`);
  const key = createPublicKey({ key: { kty: "OKP", crv: "Ed25519", x: raw.toString("base64url") }, format: "jwk" });
  return { name, keyId, key };
}

// -- the checks -----------------------------------------------------------------------------------

// A version 2 event's wire bytes end with ,"hash":"<64 hex>"} (75 bytes); the body is the rest with `}` back.
function splitWire(data) {
  const suffix = data.subarray(data.length - 75).toString("latin1");
  const match = data.length > 75 ? /^,"hash":"([0-9a-f]{64})"\}$/.exec(suffix) : null;
  if (match === null) return null;
  return [Buffer.concat([data.subarray(0, data.length - 75), Buffer.from("}")]), match[1]];
}

// RFC 9162 2.1.3.2, as events/merkle.py's verify_inclusion.
function rootFromPath(leaf, index, size, path) {
  if (!(index >= 0 && index < size)) return null;
  let fn = BigInt(index);
  let sn = BigInt(size - 1);
  let r = leaf;
  for (const p of path) {
    if (sn === 0n) return null;
    if (fn & 1n || fn === sn) {
      r = nodeHash(p, r);
      while (!(fn & 1n) && fn !== 0n) {
        fn >>= 1n;
        sn >>= 1n;
      }
    } else {
      r = nodeHash(r, p);
    }
    fn >>= 1n;
    sn >>= 1n;
  }
  return sn === 0n ? r : null;
}

function checkInclusion(doc) {
  const wire = splitWire(Buffer.from(doc.event, "utf8"));
  if (wire === null) throw new Invalid("event_hash", "the event's bytes do not end with a version 2 hash member");
  const computed = sha256(wire[0]).toString("hex");
  if (computed !== wire[1] || computed !== doc.event_hash) {
    throw new Invalid("event_hash", `the event's bytes hash to ${computed}, the proof says ${doc.event_hash}`);
  }
  const fields = JSON.parse(doc.event);
  if (fields.producer_id !== doc.producer_id || fields.seq !== doc.seq) {
    throw new Invalid("event", "the event's producer_id or seq is not the proof's");
  }
  if (doc.leaf_index !== doc.seq - 1) throw new Invalid("leaf_index", `leaf_index ${doc.leaf_index} is not seq - 1`);
  const leaf = leafHash(Buffer.from(computed, "hex"));
  if (!leaf.equals(hex32(doc.leaf_hash) ?? Buffer.alloc(0))) {
    throw new Invalid("leaf_hash", `the leaf hash is ${leaf.toString("hex")}, the proof says ${doc.leaf_hash}`);
  }
  const path = doc.audit_path.map(hex32);
  const root = hex32(doc.root);
  if (path.includes(null) || root === null) {
    throw new Invalid("audit_path", "an audit path element or the root is not 64 hex digits");
  }
  const computedRoot = rootFromPath(leaf, doc.leaf_index, doc.tree_size, path);
  if (computedRoot === null || !computedRoot.equals(root)) {
    throw new Invalid("inclusion", `the audit path does not lead to root ${doc.root} at tree size ${doc.tree_size}`);
  }
  const checkpointWire = splitWire(Buffer.from(doc.checkpoint, "utf8"));
  if (checkpointWire === null || sha256(checkpointWire[0]).toString("hex") !== checkpointWire[1]) {
    throw new Invalid("checkpoint", "the checkpoint event's bytes do not match its hash");
  }
  const checkpoint = JSON.parse(doc.checkpoint);
  for (const name of ["producer_id", "tree_size", "root", "note", "key_id"]) {
    if (checkpoint[name] !== doc[name]) throw new Invalid("checkpoint", `the checkpoint event's ${name} is not the proof's`);
  }
  if (checkpoint.type !== "Checkpoint") throw new Invalid("checkpoint", "the checkpoint is not a Checkpoint event");
}

// c2sp.org/signed-note: body (ending in a newline), a blank line, lines "— <name> <base64(key id || signature)>".
function checkNote(doc, verifier) {
  if (verifier.keyId !== doc.key_id) {
    throw new Invalid("key", `the checkpoint was signed by key id ${doc.key_id}, the key given is ${verifier.keyId}`);
  }
  const note = Buffer.from(doc.note, "utf8");
  const split = note.lastIndexOf("\n\n");
  if (split < 0) throw new Invalid("note", "malformed note: no blank line before the signatures");
  const body = note.subarray(0, split + 1);
  const lines = note.subarray(split + 2).toString("utf8").split("\n");
  if (lines.pop() !== "") throw new Invalid("note", "malformed note: the signatures must end in a newline");
  let signed = false;
  for (const line of lines) {
    if (!line.startsWith("\u2014 ")) throw new Invalid("note", "malformed note: a signature line does not start with '— '");
    const [name, encoded] = line.slice(2).split(" ");
    const blob = b64(encoded ?? "");
    if (blob === null || blob.length < 5) throw new Invalid("note", "malformed note: a signature is not base64");
    if (name !== verifier.name || blob.subarray(0, 4).toString("hex") !== verifier.keyId) continue;
    const signature = blob.subarray(4);
    if (signature.length === 64 && verify(null, body, verifier.key, signature)) signed = true;
  }
  if (!signed) throw new Invalid("signature", `the note has no valid signature by ${verifier.name} (${verifier.keyId})`);
  const text = body.toString("utf8");
  const [origin, size, rootText] = text.slice(0, -1).split("\n");
  const expected = `callgate/${doc.producer_id}`;
  if (origin !== expected) throw new Invalid("note", `the note's origin is '${origin}', expected '${expected}'`);
  if (size !== String(doc.tree_size)) throw new Invalid("note", `the note's size is ${size}, the proof's ${doc.tree_size}`);
  const root = b64(rootText ?? "");
  if (root === null || root.length !== 32 || root.toString("hex") !== doc.root) {
    throw new Invalid("root", `the note's root is not the proof's ${doc.root}`);
  }
}

function main([proofPath, keyPath]) {
  if (!proofPath || !keyPath) {
    console.error("usage: node verify_proof.mjs PROOF.json KEY.pub");
    return 2;
  }
  let doc, verifier;
  try {
    doc = loadProof(proofPath);
    verifier = loadKey(keyPath);
  } catch (error) {
    if (!(error instanceof Unreadable)) throw error;
    console.error(`cannot read: ${error.message}`);
    return 2;
  }
  try {
    checkInclusion(doc);
    checkNote(doc, verifier);
  } catch (error) {
    if (!(error instanceof Invalid)) throw error;
    console.error(`proof ${proofPath}: INVALID at ${error.step}: ${error.message}`);
    return 1;
  }
  console.log(
    `proof ${proofPath}: valid: event seq ${doc.seq} is leaf ${doc.leaf_index} of the tree of ${doc.tree_size}; ` +
      `checkpoint of callgate/${doc.producer_id} signed by ${verifier.name} (${verifier.keyId})`,
  );
  return 0;
}

process.exitCode = main(process.argv.slice(2));
