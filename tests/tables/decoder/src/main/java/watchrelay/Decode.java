package watchrelay;

import com.fasterxml.jackson.databind.JsonNode;
import io.apicurio.registry.serde.jsonschema.JsonSchemaKafkaDeserializer;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * Reads TOPIC from the beginning up to the end offsets it had when it started and decodes every
 * record value with Apicurio Registry's JSON Schema deserializer, schema validation on. The values
 * are plain JSON; the schema is the one whose id the record's headers carry
 * (apicurio.value.contentId, or apicurio.value.globalId: 8-byte big-endian longs). Tombstones
 * (null values) are skipped.
 *
 * <p>Usage: Decode BOOTSTRAP TOPIC REGISTRY_URL [TIMEOUT_SECONDS]; REGISTRY_URL is the registry's
 * base (http://HOST:PORT) or its v3 API (http://HOST:PORT/apis/registry/v3).
 *
 * <p>Prints {@code decoded N} (N records with a value) and exits 0; or names the first record that
 * failed on standard error and exits 1; exits 2 when the end offsets are not reached in time.
 */
public final class Decode {
    static final String CONTENT_ID = "apicurio.value.contentId";
    static final String GLOBAL_ID = "apicurio.value.globalId";
    // Held: java.util.logging keeps its loggers weakly. Quiets the registry client's warning that it
    // runs on a Vert.x instance of its own.
    private static final java.util.logging.Logger CLIENT_LOG =
            java.util.logging.Logger.getLogger("io.apicurio.registry.client.common");

    public static void main(String[] args) throws Exception {
        // The clients' INFO lines (their whole configuration) would bury the one line that counts.
        System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn");
        CLIENT_LOG.setLevel(java.util.logging.Level.SEVERE);
        if (args.length < 3 || args.length > 4) {
            System.err.println("usage: Decode BOOTSTRAP TOPIC REGISTRY_URL [TIMEOUT_SECONDS]");
            System.exit(2);
        }
        String bootstrap = args[0];
        String topic = args[1];
        String registry = args[2].replaceAll("/+$", "");
        if (!registry.endsWith("/apis/registry/v3")) {
            registry += "/apis/registry/v3";
        }
        long deadline = System.nanoTime() + Duration.ofSeconds(args.length == 4 ? Long.parseLong(args[3]) : 60).toNanos();

        Map<String, Object> serde = new HashMap<>();
        serde.put("apicurio.registry.url", registry);
        // The schema's id travels in the record's headers, not in front of the value.
        serde.put("apicurio.registry.headers.enabled", "true");
        serde.put("apicurio.registry.serde.validation-enabled", "true");

        Properties consumerConfig = new Properties();
        consumerConfig.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        consumerConfig.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        consumerConfig.put(ConsumerConfig.CLIENT_ID_CONFIG, "watchrelay-decode");
        // Records of aborted transactions are not the relay's output.
        consumerConfig.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");

        long decoded = 0;
        try (JsonSchemaKafkaDeserializer<JsonNode> deserializer = new JsonSchemaKafkaDeserializer<>();
             KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(consumerConfig,
                     new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
            deserializer.configure(serde, false);

            List<TopicPartition> partitions = new ArrayList<>();
            List<PartitionInfo> infos = consumer.partitionsFor(topic, Duration.ofSeconds(30));
            if (infos == null || infos.isEmpty()) {
                System.err.println("topic " + topic + " has no partitions");
                System.exit(1);
            }
            for (PartitionInfo info : infos) {
                partitions.add(new TopicPartition(topic, info.partition()));
            }
            consumer.assign(partitions);
            consumer.seekToBeginning(partitions);
            Map<TopicPartition, Long> end = consumer.endOffsets(partitions, Duration.ofSeconds(30));

            while (!reachedEnd(consumer, end)) {
                if (System.nanoTime() > deadline) {
                    System.err.println("timed out before the end offsets " + end + "; decoded " + decoded);
                    System.exit(2);
                }
                for (ConsumerRecord<byte[], byte[]> record : consumer.poll(Duration.ofMillis(200))) {
                    TopicPartition tp = new TopicPartition(record.topic(), record.partition());
                    if (record.offset() >= end.get(tp) || record.value() == null) {
                        continue;
                    }
                    String name = record.topic() + "-" + record.partition() + "@" + record.offset();
                    if (record.headers().lastHeader(CONTENT_ID) == null
                            && record.headers().lastHeader(GLOBAL_ID) == null) {
                        fail(name, "no " + CONTENT_ID + " or " + GLOBAL_ID + " header", record);
                    }
                    try {
                        JsonNode value = deserializer.deserialize(record.topic(), record.headers(), record.value());
                        if (value == null) {
                            fail(name, "decoded to nothing", record);
                        }
                    } catch (RuntimeException e) {
                        fail(name, e.toString(), record);
                    }
                    decoded++;
                }
            }
        }
        System.out.println("decoded " + decoded);
    }

    private static boolean reachedEnd(KafkaConsumer<?, ?> consumer, Map<TopicPartition, Long> end) {
        for (Map.Entry<TopicPartition, Long> e : end.entrySet()) {
            if (consumer.position(e.getKey()) < e.getValue()) {
                return false;
            }
        }
        return true;
    }

    private static void fail(String name, String why, ConsumerRecord<byte[], byte[]> record) {
        String value = new String(record.value(), java.nio.charset.StandardCharsets.UTF_8);
        if (value.length() > 300) {
            value = value.substring(0, 300) + "...";
        }
        System.err.println("record " + name + " failed: " + why + "\n  value: " + value);
        System.exit(1);
    }
}
