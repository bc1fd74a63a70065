// Reads every record of a callgate events topic with kafkajs, the stock Node.js Kafka client, and
// prints one JSON line per record: where it was, its CloudEvents type header, the event's fields
// that identify it, the `hash` it carries and the SHA-256 recomputed from its bytes (docs/events.md,
// *Checking*); then one line with each partition's high watermark from the fetch responses.
// Usage: node consume.mjs BOOTSTRAP TOPIC GROUP COUNT (reads until COUNT records arrived)
//
// Two things a kafkajs reader of the topic must do, shown here:
// - KafkaSink compresses with zstd, which kafkajs does not decode by itself: a codec is registered
//   (fzstd, pure JavaScript; the reader never compresses).
// - Where the topic ends is taken from the fetch responses (each batch's high watermark), not from
//   ListOffsets, which the embedded development broker may answer wrongly.
import { createHash } from "node:crypto";
import kafkajs from "kafkajs";
import { decompress } from "fzstd";

const { CompressionCodecs, CompressionTypes, Kafka, logLevel } = kafkajs;

const [bootstrap, topic, groupId, countText] = process.argv.slice(2);
const count = Number(countText);
if (!groupId || !Number.isInteger(count)) {
  console.error("usage: node consume.mjs BOOTSTRAP TOPIC GROUP COUNT");
  process.exit(2);
}

CompressionCodecs[CompressionTypes.ZSTD] = () => ({
  async compress() {
    throw new Error("this reader only decompresses");
  },
  async decompress(buffer) {
    return Buffer.from(decompress(buffer));
  },
});

const HASH_SUFFIX = /^,"hash":"([0-9a-f]{64})"\}$/;

function record(partition, message) {
  const wire = message.value;
  const suffix = wire.subarray(wire.length - 75).toString("latin1");
  const match = HASH_SUFFIX.exec(suffix);
  const body = Buffer.concat([wire.subarray(0, wire.length - 75), Buffer.from("}")]);
  const event = JSON.parse(wire.toString("utf8"));
  return {
    partition,
    offset: Number(message.offset),
    key: message.key?.toString("utf8") ?? null,
    ce_type: message.headers?.ce_type?.toString("utf8") ?? null,
    event_id: event.event_id,
    producer_id: event.producer_id,
    seq: event.seq,
    type: event.type,
    hash: match ? match[1] : null,
    recomputed: createHash("sha256").update(body).digest("hex"),
  };
}

const kafka = new Kafka({ clientId: "callgate-node-reader", brokers: [bootstrap], logLevel: logLevel[process.env.KAFKAJS_LOG ?? "ERROR"] });
const consumer = kafka.consumer({ groupId, maxWaitTimeInMs: 200, sessionTimeout: 3000, heartbeatInterval: 500, rebalanceTimeout: 1000 });
await consumer.connect();
// fromBeginning starts a new group at each partition's earliest offset (ListOffsets for the earliest
// offset is answered right; the end of a partition is read from the fetch responses instead).
await consumer.subscribe({ topics: [topic], fromBeginning: true });
const lines = [];
const highWatermarks = {};
let finish;
const finished = new Promise((resolve) => (finish = resolve));
await consumer.run({
  autoCommit: false,
  eachBatch: async ({ batch }) => {
    for (const message of batch.messages) lines.push(JSON.stringify(record(batch.partition, message)));
    highWatermarks[batch.partition] = Number(batch.highWatermark);
    if (lines.length >= count) finish();
  },
});
const timer = setTimeout(() => {
  console.error(`timed out after ${lines.length} of ${count} records`);
  process.exit(1);
}, 30000);
await finished;
clearTimeout(timer);
await consumer.disconnect();
lines.push(JSON.stringify({ high_watermarks: highWatermarks }));
process.stdout.write(lines.map((line) => line + "\n").join(""));
