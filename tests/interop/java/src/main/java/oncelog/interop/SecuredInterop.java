package oncelog.interop;

import java.io.FileInputStream;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collection;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.DescribeClusterResult;
import org.apache.kafka.clients.admin.DescribeProducersResult.PartitionProducerState;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.ProducerState;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.utils.internals.AppInfoParser;

/**
 * The Java client over a secured listener (TLS, mutual TLS, SASL), driven by tests/interop/test_secured_java.py.
 *
 * <p>Usage: {@code java -cp oncelog-java-interop.jar oncelog.interop.SecuredInterop SUBCOMMAND --bootstrap HOST:PORT
 * --config FILE [--key value ...]}. FILE is a Java properties file with the client's security settings exactly as
 * an application would write them (security.protocol, ssl.*, sasl.*); every client of the run takes them. Prints
 * one JSON object in the shape {@link Interop} prints (steps recorded as ok/value or ok/error with the exception
 * chain), exits 0 when the subcommand ran to its end; exit 3 when the watchdog ({@code --deadline-s}) fired.
 *
 * <ul>
 *   <li>{@code roundtrip --topic T --count N --partitions P --group G}: the Admin creates the topic and describes
 *   the cluster; an idempotent producer (acks=all) writes N records round-robin; the Admin describes the
 *   partitions' producers; a consumer of group G (subscribe) reads all N and commits; the Admin reads the group's
 *   committed offsets.</li>
 *   <li>{@code auth-fail [--timeout-ms MS]}: the same clients with the (wrong) credentials of FILE:
 *   Admin.describeCluster, a producer's send and a consumer's poll (each bounded by MS, default 20000), each
 *   expected to fail with the client's authentication exception.</li>
 * </ul>
 */
public final class SecuredInterop {

    private static final Map<String, Object> RESULT = new LinkedHashMap<>();
    private static final Map<String, Object> STEPS = new LinkedHashMap<>();
    private static boolean printed;

    private final Map<String, String> opts;
    private final Properties security = new Properties();

    private SecuredInterop(Map<String, String> opts) throws Exception {
        this.opts = opts;
        try (InputStream in = new FileInputStream(opts.get("config"))) {
            security.load(in);
        }
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 1) {
            usage("missing subcommand");
        }
        String command = args[0];
        Map<String, String> opts = new HashMap<>();
        for (int i = 1; i < args.length; i += 2) {
            if (!args[i].startsWith("--") || i + 1 >= args.length) {
                usage("bad argument " + args[i]);
            }
            opts.put(args[i].substring(2), args[i + 1]);
        }
        if (!opts.containsKey("bootstrap") || !opts.containsKey("config")) {
            usage("--bootstrap and --config are required");
        }
        long deadlineS = Long.parseLong(opts.getOrDefault("deadline-s", "90"));
        Thread watchdog = new Thread(() -> {
            try {
                Thread.sleep(deadlineS * 1000);
            } catch (InterruptedException e) {
                return;
            }
            synchronized (RESULT) {
                RESULT.put("watchdog", "subcommand did not finish in " + deadlineS + " s");
                emit();
            }
            Runtime.getRuntime().halt(3);
        }, "secured-interop-watchdog");
        watchdog.setDaemon(true);
        watchdog.start();

        put("command", command);
        put("client_version", AppInfoParser.getVersion());
        put("steps", STEPS);
        long start = System.nanoTime();
        int code = 0;
        try {
            SecuredInterop it = new SecuredInterop(opts);
            switch (command) {
                case "roundtrip" -> it.roundtrip();
                case "auth-fail" -> it.authFail();
                default -> usage("unknown subcommand " + command);
            }
        } catch (Throwable t) {
            put("fatal", Interop.describe(t));
            code = 1;
        }
        put("elapsed_ms", (System.nanoTime() - start) / 1_000_000);
        synchronized (RESULT) {
            emit();
        }
        System.out.flush();
        Runtime.getRuntime().halt(code);
    }

    private static void usage(String why) {
        System.err.println("usage: SecuredInterop {roundtrip|auth-fail} --bootstrap HOST:PORT --config FILE"
                + " [--key value ...]\n" + why);
        System.exit(2);
    }

    private static void emit() {
        if (!printed) {
            printed = true;
            System.out.println(Interop.Json.write(RESULT));
            System.out.flush();
        }
    }

    private static void put(String key, Object value) {
        synchronized (RESULT) {
            RESULT.put(key, value);
        }
    }

    private static Object step(String name, Interop.Body body) {
        long t0 = System.nanoTime();
        Map<String, Object> rec = new LinkedHashMap<>();
        Object value = null;
        try {
            value = body.run();
            rec.put("ok", true);
            rec.put("value", value);
        } catch (Throwable t) {
            rec.put("ok", false);
            rec.put("error", Interop.describe(t));
        }
        rec.put("ms", (System.nanoTime() - t0) / 1_000_000);
        synchronized (RESULT) {
            STEPS.put(name, rec);
        }
        return value;
    }

    private static Map<String, Object> obj(Object... kv) {
        Map<String, Object> m = new LinkedHashMap<>();
        for (int i = 0; i < kv.length; i += 2) {
            m.put((String) kv[i], kv[i + 1]);
        }
        return m;
    }

    private int intOpt(String key, int dflt) {
        return Integer.parseInt(opts.getOrDefault(key, Integer.toString(dflt)));
    }

    // ------------------------------------------------------------------------------------------------------------
    // clients: the security settings of --config on top of short timeouts

    private Properties common(String clientId) {
        Properties p = new Properties();
        p.put("bootstrap.servers", opts.get("bootstrap"));
        p.put("client.id", clientId);
        p.put("request.timeout.ms", "10000");
        p.put("reconnect.backoff.ms", "50");
        p.put("reconnect.backoff.max.ms", "1000");
        p.put("retry.backoff.ms", "50");
        p.put("retry.backoff.max.ms", "1000");
        p.putAll(security);
        return p;
    }

    Admin admin() {
        return admin(20_000);
    }

    Admin admin(int apiTimeoutMs) {
        Properties p = common("secured-admin");
        p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, Integer.toString(apiTimeoutMs));
        // the Admin refuses a default API timeout below the request timeout
        p.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, Integer.toString(Math.min(10_000, apiTimeoutMs)));
        return Admin.create(p);
    }

    KafkaProducer<byte[], byte[]> producer() {
        return producer(new Properties());
    }

    KafkaProducer<byte[], byte[]> producer(Properties extra) {
        Properties p = common("secured-producer");
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        p.put(ProducerConfig.BATCH_SIZE_CONFIG, "4096"); // several batches per partition
        p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "20000");
        p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "30000");
        p.putAll(extra);
        return new KafkaProducer<>(p);
    }

    KafkaConsumer<byte[], byte[]> consumer(String group) {
        Properties p = common("secured-consumer");
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "20000");
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        p.put(ConsumerConfig.CHECK_CRCS_CONFIG, "true");
        p.put(ConsumerConfig.FETCH_MAX_WAIT_MS_CONFIG, "100");
        p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        return new KafkaConsumer<>(p);
    }

    static byte[] bytes(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    static String str(byte[] b) {
        return b == null ? null : new String(b, StandardCharsets.UTF_8);
    }

    static Map<String, Object> nodeJson(Node n) {
        return obj("id", n.id(), "host", n.host(), "port", n.port());
    }

    // ------------------------------------------------------------------------------------------------------------
    // roundtrip

    void roundtrip() {
        String topic = opts.get("topic");
        String group = opts.get("group");
        int count = intOpt("count", 300);
        int nparts = intOpt("partitions", 3);
        List<TopicPartition> tps = new ArrayList<>();
        for (int p = 0; p < nparts; p++) {
            tps.add(new TopicPartition(topic, p));
        }
        try (Admin admin = admin()) {
            step("describe_cluster", () -> {
                DescribeClusterResult r = admin.describeCluster();
                List<Object> nodes = new ArrayList<>();
                for (Node n : r.nodes().get(20, TimeUnit.SECONDS)) {
                    nodes.add(nodeJson(n));
                }
                return obj("cluster_id", r.clusterId().get(20, TimeUnit.SECONDS),
                        "controller", nodeJson(r.controller().get(20, TimeUnit.SECONDS)), "nodes", nodes);
            });
            step("create_topic", () -> {
                admin.createTopics(List.of(new NewTopic(topic, nparts, (short) 1))).all().get(20, TimeUnit.SECONDS);
                return null;
            });
            List<Object> produced = new ArrayList<>();
            step("produce", () -> {
                try (KafkaProducer<byte[], byte[]> producer = producer()) {
                    List<Future<RecordMetadata>> futures = new ArrayList<>();
                    for (int i = 0; i < count; i++) {
                        futures.add(producer.send(new ProducerRecord<>(topic, i % nparts, bytes("k-" + i),
                                bytes("v-" + i + "-" + "x".repeat(i % 50)))));
                    }
                    producer.flush();
                    for (int i = 0; i < count; i++) {
                        RecordMetadata md = futures.get(i).get(40, TimeUnit.SECONDS);
                        produced.add(Arrays.asList(i, md.partition(), md.offset()));
                    }
                    Map<String, Object> metrics = new TreeMap<>();
                    for (var e : producer.metrics().entrySet()) {
                        String n = e.getKey().name();
                        if (e.getKey().group().equals("producer-metrics") && (n.equals("record-error-total")
                                || n.equals("record-retry-total") || n.equals("batch-size-avg"))) {
                            metrics.put(n, e.getValue().metricValue());
                        }
                    }
                    return metrics;
                }
            });
            put("produced", produced);
            step("describe_producers", () -> {
                Map<String, Object> out = new TreeMap<>();
                for (Map.Entry<TopicPartition, PartitionProducerState> e
                        : admin.describeProducers(tps).all().get(20, TimeUnit.SECONDS).entrySet()) {
                    List<Object> list = new ArrayList<>();
                    for (ProducerState s : e.getValue().activeProducers()) {
                        list.add(obj("producer_id", s.producerId(), "producer_epoch", s.producerEpoch(),
                                "last_sequence", s.lastSequence(),
                                "current_txn_start_offset", s.currentTransactionStartOffset()));
                    }
                    out.put(e.getKey().toString(), list);
                }
                return out;
            });
            step("consume", () -> {
                List<Object> seen = new ArrayList<>();
                try (KafkaConsumer<byte[], byte[]> consumer = consumer(group)) {
                    consumer.subscribe(List.of(topic));
                    long deadline = System.currentTimeMillis() + 40_000;
                    while (seen.size() < count && System.currentTimeMillis() < deadline) {
                        for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(200))) {
                            seen.add(Arrays.asList(r.partition(), r.offset(), str(r.key()), str(r.value())));
                        }
                    }
                    consumer.commitSync(Duration.ofSeconds(20));
                    List<String> assignment = new ArrayList<>();
                    for (TopicPartition tp : consumer.assignment()) {
                        assignment.add(tp.toString());
                    }
                    assignment.sort(null);
                    return obj("records", seen, "assignment", assignment);
                }
            });
            step("committed", () -> {
                Map<String, Object> out = new TreeMap<>();
                Map<TopicPartition, OffsetAndMetadata> offsets = admin.listConsumerGroupOffsets(group)
                        .partitionsToOffsetAndMetadata().get(20, TimeUnit.SECONDS);
                for (Map.Entry<TopicPartition, OffsetAndMetadata> e : offsets.entrySet()) {
                    out.put(e.getKey().toString(), e.getValue().offset());
                }
                return out;
            });
        }
    }

    // ------------------------------------------------------------------------------------------------------------
    // auth-fail: each client meets the broker's refusal of the credentials

    void authFail() {
        String topic = opts.getOrDefault("topic", "secured-auth-fail");
        int timeoutMs = intOpt("timeout-ms", 20_000);
        step("admin_describe_cluster", () -> {
            try (Admin admin = admin(timeoutMs)) {
                Collection<Node> nodes = admin.describeCluster().nodes().get(timeoutMs, TimeUnit.MILLISECONDS);
                return nodes.size();
            }
        });
        step("producer_send", () -> {
            Properties bounded = new Properties();
            bounded.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, Integer.toString(timeoutMs));
            try (KafkaProducer<byte[], byte[]> producer = producer(bounded)) {
                return producer.send(new ProducerRecord<>(topic, bytes("k"), bytes("v")))
                        .get(timeoutMs + 10_000L, TimeUnit.MILLISECONDS).offset();
            }
        });
        step("consumer_poll", () -> {
            try (KafkaConsumer<byte[], byte[]> consumer = consumer("secured-auth-fail")) {
                consumer.subscribe(Set.of(topic));
                long deadline = System.currentTimeMillis() + timeoutMs;
                int polled = 0;
                while (System.currentTimeMillis() < deadline) {
                    polled += consumer.poll(Duration.ofMillis(500)).count();
                }
                return polled;
            }
        });
    }
}
