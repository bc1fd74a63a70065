// Reads a callgate events topic with Apache kafka-clients, the stock Java Kafka client, and prints one
// JSON line per record: where it was, its CloudEvents type header, the event's fields that identify it,
// the `hash` it carries and the SHA-256 recomputed from its bytes (docs/events.md, *Checking*); then
// one line with each partition's high watermark from the fetch responses (position plus lag).
// Usage: java -cp kafka-clients.jar:zstd-jni.jar:lz4-java.jar:slf4j-api.jar Consume.java BOOTSTRAP TOPIC COUNT
//
// kafka-clients decodes zstd itself (with zstd-jni on the class path); every partition is assigned
// and started at offset 0, and read until COUNT records arrived.
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.Properties;
import java.util.TreeMap;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public class Consume {
    private static final Pattern HASH_SUFFIX = Pattern.compile("^,\"hash\":\"([0-9a-f]{64})\"\\}$");
    // The wire bytes are compact JSON written by the producer: these members are read from it as
    // they stand (a JSON library would do the same; the class path holds only the Kafka client).
    private static final Pattern STRING_MEMBER = Pattern.compile("\"(event_id|producer_id|type)\":\"([^\"\\\\]*)\"");
    private static final Pattern SEQ_MEMBER = Pattern.compile("\"seq\":(\\d+)");

    private static String quote(String value) {
        return value == null ? "null" : "\"" + value.replace("\\", "\\\\").replace("\"", "\\\"") + "\"";
    }

    private static String line(ConsumerRecord<byte[], byte[]> record) throws Exception {
        byte[] wire = record.value();
        String suffix = new String(wire, wire.length - 75, 75, StandardCharsets.ISO_8859_1);
        Matcher carried = HASH_SUFFIX.matcher(suffix);
        MessageDigest sha = MessageDigest.getInstance("SHA-256");
        sha.update(wire, 0, wire.length - 75);
        sha.update((byte) '}');
        String text = new String(wire, StandardCharsets.UTF_8);
        TreeMap<String, String> members = new TreeMap<>();
        Matcher member = STRING_MEMBER.matcher(text);
        while (member.find()) members.putIfAbsent(member.group(1), member.group(2));
        Matcher seq = SEQ_MEMBER.matcher(text);
        Header ceType = record.headers().lastHeader("ce_type");
        return "{\"partition\":" + record.partition()
            + ",\"offset\":" + record.offset()
            + ",\"key\":" + quote(record.key() == null ? null : new String(record.key(), StandardCharsets.UTF_8))
            + ",\"ce_type\":" + quote(ceType == null ? null : new String(ceType.value(), StandardCharsets.UTF_8))
            + ",\"event_id\":" + quote(members.get("event_id"))
            + ",\"producer_id\":" + quote(members.get("producer_id"))
            + ",\"seq\":" + (seq.find() ? seq.group(1) : "null")
            + ",\"type\":" + quote(members.get("type"))
            + ",\"hash\":" + quote(carried.matches() ? carried.group(1) : null)
            + ",\"recomputed\":" + quote(HexFormat.of().formatHex(sha.digest()))
            + "}";
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 3) {
            System.err.println("usage: Consume BOOTSTRAP TOPIC COUNT");
            System.exit(2);
        }
        String topic = args[1];
        int count = Integer.parseInt(args[2]);
        Properties config = new Properties();
        config.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        config.put(ConsumerConfig.CLIENT_ID_CONFIG, "callgate-java-reader");
        config.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        config.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        config.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(config)) {
            List<TopicPartition> partitions = new ArrayList<>();
            consumer.partitionsFor(topic, Duration.ofSeconds(10))
                .forEach(p -> partitions.add(new TopicPartition(topic, p.partition())));
            consumer.assign(partitions);
            partitions.forEach(p -> consumer.seek(p, 0));
            long deadline = System.nanoTime() + Duration.ofSeconds(30).toNanos();
            int read = 0;
            StringBuilder out = new StringBuilder();
            while (read < count) {
                if (System.nanoTime() > deadline) {
                    System.err.println("timed out after " + read + " of " + count + " records");
                    System.exit(1);
                }
                for (ConsumerRecord<byte[], byte[]> record : consumer.poll(Duration.ofMillis(200))) {
                    out.append(line(record)).append('\n');
                    read++;
                }
            }
            List<String> ends = new ArrayList<>();
            for (TopicPartition p : partitions) {
                long lag = consumer.currentLag(p).orElse(-1);
                ends.add("\"" + p.partition() + "\":" + (lag < 0 ? "null" : String.valueOf(consumer.position(p) + lag)));
            }
            out.append("{\"high_watermarks\":{").append(String.join(",", ends)).append("}}\n");
            System.out.print(out);
        }
    }
}
