package oncelog.interop;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Base64;
import java.util.Collection;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.OptionalInt;
import java.util.OptionalLong;
import java.util.Properties;
import java.util.Random;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.AbortTransactionSpec;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.CreateTopicsOptions;
import org.apache.kafka.clients.admin.DescribeClusterResult;
import org.apache.kafka.clients.admin.DescribeProducersResult.PartitionProducerState;
import org.apache.kafka.clients.admin.GroupListing;
import org.apache.kafka.clients.admin.ListOffsetsOptions;
import org.apache.kafka.clients.admin.ListOffsetsResult.ListOffsetsResultInfo;
import org.apache.kafka.clients.admin.ListTransactionsOptions;
import org.apache.kafka.clients.admin.LogDirDescription;
import org.apache.kafka.clients.admin.MemberDescription;
import org.apache.kafka.clients.admin.NewPartitions;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.ProducerState;
import org.apache.kafka.clients.admin.RecordsToDelete;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.admin.TransactionDescription;
import org.apache.kafka.clients.admin.TransactionListing;
import org.apache.kafka.clients.admin.TransactionState;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerGroupMetadata;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.IsolationLevel;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.utils.internals.AppInfoParser;

/**
 * The Java client (kafka-clients from Maven Central) against an oncelog broker.
 *
 * <p>Usage: {@code java -jar oncelog-java-interop.jar SUBCOMMAND --bootstrap HOST:PORT [--key value ...]}.
 * Every subcommand prints exactly one JSON object on stdout (the client's logs go to stderr) and exits 0 when it
 * ran to the end, whatever the broker answered: the pytest driver asserts on the JSON. Each step is recorded as
 * {@code {"ok": true, "value": ...}} or {@code {"ok": false, "error": {"class": ..., "causes": [...], ...}}}, so one
 * failing step never hides the next. Exit 2: bad usage; exit 3: the watchdog fired ({@code --deadline-s}), after
 * printing what was recorded so far; exit 1: an unexpected exception outside a step.
 */
public final class Interop {

    private static final Map<String, Object> RESULT = new LinkedHashMap<>();
    private static final Map<String, Object> STEPS = new LinkedHashMap<>();
    private static boolean printed;

    private final Map<String, String> opts;
    private final String bootstrap;

    private Interop(Map<String, String> opts) {
        this.opts = opts;
        this.bootstrap = opts.get("bootstrap");
    }

    // ------------------------------------------------------------------------------------------------------------
    // entry point, watchdog, steps

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
        if (!command.equals("version") && !opts.containsKey("bootstrap")) {
            usage("--bootstrap is required");
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
                RESULT.put("threads", threadDump());
                emit();
            }
            Runtime.getRuntime().halt(3);
        }, "interop-watchdog");
        watchdog.setDaemon(true);
        watchdog.start();

        put("command", command);
        put("client_version", AppInfoParser.getVersion());
        put("steps", STEPS);
        Interop it = new Interop(opts);
        long start = System.nanoTime();
        int code = 0;
        try {
            switch (command) {
                case "version" -> { }
                case "roundtrip" -> it.roundtrip();
                case "consume" -> it.consume();
                case "admin" -> it.adminScenario();
                case "txn" -> it.txnCommitAbort();
                case "txn-fence" -> it.txnFence();
                case "txn-timeout" -> it.txnTimeout();
                case "groups" -> it.groups();
                case "kip664" -> it.kip664();
                case "produce-bench" -> it.produceBench();
                case "epoch-validate" -> it.epochValidate();
                default -> usage("unknown subcommand " + command);
            }
        } catch (Throwable t) {
            put("fatal", describe(t));
            code = 1;
        }
        put("elapsed_ms", (System.nanoTime() - start) / 1_000_000);
        synchronized (RESULT) {
            emit();
        }
        System.out.flush();
        // Clients are closed by each scenario; halt so a stuck non-daemon client thread can never keep the JVM alive.
        Runtime.getRuntime().halt(code);
    }

    private static void usage(String why) {
        System.err.println("usage: Interop {version|roundtrip|consume|admin|txn|txn-fence|txn-timeout|groups|kip664}"
                + " --bootstrap HOST:PORT [--key value ...]\n" + why);
        System.exit(2);
    }

    private static void emit() {
        if (!printed) {
            printed = true;
            System.out.println(Json.write(RESULT));
            System.out.flush();
        }
    }

    private static void put(String key, Object value) {
        synchronized (RESULT) {
            RESULT.put(key, value);
        }
    }

    @FunctionalInterface
    interface Body {
        Object run() throws Exception;
    }

    /** Run one step, record its value or its exception chain (with a stack excerpt) and its duration. */
    private static Object step(String name, Body body) {
        long t0 = System.nanoTime();
        Map<String, Object> rec = new LinkedHashMap<>();
        Object value = null;
        try {
            value = body.run();
            rec.put("ok", true);
            rec.put("value", value);
        } catch (Throwable t) {
            rec.put("ok", false);
            rec.put("error", describe(t));
        }
        rec.put("ms", (System.nanoTime() - t0) / 1_000_000);
        synchronized (RESULT) {
            STEPS.put(name, rec);
        }
        return value;
    }

    private static boolean ok(String name) {
        synchronized (RESULT) {
            Object rec = STEPS.get(name);
            return rec != null && Boolean.TRUE.equals(((Map<?, ?>) rec).get("ok"));
        }
    }

    /** An exception as JSON: the outer class, the chain of causes (ExecutionException unwrapped), a stack excerpt. */
    static Map<String, Object> describe(Throwable t) {
        Map<String, Object> out = new LinkedHashMap<>();
        Throwable outer = t;
        if (outer instanceof ExecutionException && outer.getCause() != null) {
            outer = outer.getCause();
        }
        out.put("class", outer.getClass().getName());
        out.put("message", outer.getMessage());
        List<Object> causes = new ArrayList<>();
        Set<Throwable> seen = new HashSet<>();
        for (Throwable c = outer.getCause(); c != null && seen.add(c); c = c.getCause()) {
            Map<String, Object> cause = new LinkedHashMap<>();
            cause.put("class", c.getClass().getName());
            cause.put("message", c.getMessage());
            causes.add(cause);
        }
        out.put("causes", causes);
        List<String> classes = new ArrayList<>();
        classes.add(outer.getClass().getName());
        for (Object c : causes) {
            classes.add((String) ((Map<?, ?>) c).get("class"));
        }
        out.put("chain", classes);
        out.put("stack", stackExcerpt(outer, 8));
        return out;
    }

    private static List<String> stackExcerpt(Throwable t, int frames) {
        List<String> lines = new ArrayList<>();
        StackTraceElement[] st = t.getStackTrace();
        for (int i = 0; i < Math.min(frames, st.length); i++) {
            lines.add(st[i].toString());
        }
        return lines;
    }

    private static Map<String, Object> threadDump() {
        Map<String, Object> out = new TreeMap<>();
        for (Map.Entry<Thread, StackTraceElement[]> e : Thread.getAllStackTraces().entrySet()) {
            List<String> frames = new ArrayList<>();
            for (int i = 0; i < Math.min(6, e.getValue().length); i++) {
                frames.add(e.getValue()[i].toString());
            }
            out.put(e.getKey().getName(), frames);
        }
        return out;
    }

    private static Map<String, Object> obj(Object... kv) {
        Map<String, Object> m = new LinkedHashMap<>();
        for (int i = 0; i < kv.length; i += 2) {
            m.put((String) kv[i], kv[i + 1]);
        }
        return m;
    }

    private static void sleep(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    // ------------------------------------------------------------------------------------------------------------
    // clients

    private String opt(String key, String dflt) {
        return opts.getOrDefault(key, dflt);
    }

    private int intOpt(String key, int dflt) {
        return Integer.parseInt(opts.getOrDefault(key, Integer.toString(dflt)));
    }

    private Properties common(String clientId) {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("client.id", clientId);
        p.put("request.timeout.ms", "10000");
        p.put("reconnect.backoff.ms", "50");
        p.put("reconnect.backoff.max.ms", "1000");
        p.put("retry.backoff.ms", "50");
        p.put("retry.backoff.max.ms", "1000");
        return p;
    }

    Admin admin() {
        Properties p = common("interop-admin");
        p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "20000");
        return Admin.create(p);
    }

    KafkaProducer<byte[], byte[]> producer(String clientId, Map<String, String> extra) {
        Properties p = common(clientId);
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "20000");
        p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "30000");
        p.putAll(extra);
        return new KafkaProducer<>(p);
    }

    KafkaProducer<byte[], byte[]> txProducer(String txnId, int timeoutMs) {
        return producer("interop-" + txnId, Map.of(
                ProducerConfig.TRANSACTIONAL_ID_CONFIG, txnId,
                ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, Integer.toString(timeoutMs)));
    }

    KafkaConsumer<byte[], byte[]> consumer(String groupId, String isolation, Map<String, String> extra) {
        Properties p = common("interop-consumer");
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "20000");
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        p.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, isolation);
        p.put(ConsumerConfig.CHECK_CRCS_CONFIG, "true");
        p.put(ConsumerConfig.FETCH_MAX_WAIT_MS_CONFIG, "100");
        if (groupId != null) {
            p.put(ConsumerConfig.GROUP_ID_CONFIG, groupId);
        }
        p.putAll(extra);
        return new KafkaConsumer<>(p);
    }

    void createTopic(Admin admin, String topic, int partitions) throws Exception {
        admin.createTopics(List.of(new NewTopic(topic, partitions, (short) 1))).all().get(20, TimeUnit.SECONDS);
    }

    /**
     * Assign mode, no group: every partition of {@code tps} read from its beginning to the end offset the consumer
     * sees when it starts (the high watermark, or the LSO under read_committed).
     */
    List<ConsumerRecord<byte[], byte[]>> readAll(Collection<TopicPartition> tps, String isolation) {
        List<ConsumerRecord<byte[], byte[]>> out = new ArrayList<>();
        try (KafkaConsumer<byte[], byte[]> c = consumer(null, isolation, Map.of())) {
            c.assign(tps);
            c.seekToBeginning(tps);
            Map<TopicPartition, Long> end = c.endOffsets(tps, Duration.ofSeconds(20));
            long deadline = System.currentTimeMillis() + 20_000;
            while (System.currentTimeMillis() < deadline) {
                boolean done = true;
                for (TopicPartition tp : tps) {
                    if (c.position(tp, Duration.ofSeconds(20)) < end.get(tp)) {
                        done = false;
                    }
                }
                if (done) {
                    break;
                }
                for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(200))) {
                    out.add(r);
                }
            }
            Map<String, Long> positions = new TreeMap<>();
            for (TopicPartition tp : tps) {
                positions.put(tp.toString(), c.position(tp));
                if (c.position(tp) < end.get(tp)) {
                    throw new IllegalStateException("did not reach the end of " + tp + ": position "
                            + c.position(tp) + " < end " + end.get(tp));
                }
            }
        }
        out.sort((a, b) -> a.partition() != b.partition() ? Integer.compare(a.partition(), b.partition())
                : Long.compare(a.offset(), b.offset()));
        return out;
    }

    static String str(byte[] b) {
        return b == null ? null : new String(b, StandardCharsets.UTF_8);
    }

    static byte[] bytes(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    static Map<String, Object> recordJson(ConsumerRecord<byte[], byte[]> r) {
        List<Object> headers = new ArrayList<>();
        for (Header h : r.headers()) {
            headers.add(Arrays.asList(h.key(), h.value()));
        }
        return obj("partition", r.partition(), "offset", r.offset(), "key", r.key(), "value", r.value(),
                "headers", headers, "timestamp", r.timestamp(), "timestamp_type", r.timestampType().name);
    }

    /** Values of the records as strings, per partition, in offset order. */
    static Map<String, List<Object>> valuesByPartition(List<ConsumerRecord<byte[], byte[]>> recs) {
        Map<String, List<Object>> out = new TreeMap<>();
        for (ConsumerRecord<byte[], byte[]> r : recs) {
            out.computeIfAbsent(Integer.toString(r.partition()), k -> new ArrayList<>())
                    .add(Arrays.asList(r.offset(), str(r.value())));
        }
        return out;
    }

    Map<String, Object> offsets(Admin admin, TopicPartition tp) throws Exception {
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("earliest", admin.listOffsets(Map.of(tp, OffsetSpec.earliest())).partitionResult(tp).get().offset());
        out.put("latest", admin.listOffsets(Map.of(tp, OffsetSpec.latest())).partitionResult(tp).get().offset());
        out.put("last_stable", admin.listOffsets(Map.of(tp, OffsetSpec.latest()),
                new ListOffsetsOptions(IsolationLevel.READ_COMMITTED)).partitionResult(tp).get().offset());
        return out;
    }

    static Map<String, Object> txnJson(TransactionDescription d) {
        return obj("state", d.state().name(), "producer_id", d.producerId(), "producer_epoch", d.producerEpoch(),
                "timeout_ms", d.transactionTimeoutMs(), "start_ms", d.transactionStartTimeMs(),
                "coordinator_id", d.coordinatorId(), "partitions", tpStrings(d.topicPartitions()));
    }

    Map<String, Object> describeTxn(Admin admin, String txnId) throws Exception {
        return txnJson(admin.describeTransactions(List.of(txnId)).description(txnId).get(20, TimeUnit.SECONDS));
    }

    static List<String> tpStrings(Collection<TopicPartition> tps) {
        List<String> out = new ArrayList<>();
        for (TopicPartition tp : tps) {
            out.add(tp.toString());
        }
        out.sort(null);
        return out;
    }

    static Map<String, Object> producerJson(ProducerState s) {
        return obj("producer_id", s.producerId(), "producer_epoch", s.producerEpoch(),
                "last_sequence", s.lastSequence(), "last_timestamp", s.lastTimestamp(),
                "coordinator_epoch", s.coordinatorEpoch(),
                "current_txn_start_offset", s.currentTransactionStartOffset());
    }

    Map<String, Object> describeProducers(Admin admin, Collection<TopicPartition> tps) throws Exception {
        Map<String, Object> out = new TreeMap<>();
        for (Map.Entry<TopicPartition, PartitionProducerState> e
                : admin.describeProducers(tps).all().get(20, TimeUnit.SECONDS).entrySet()) {
            List<Object> list = new ArrayList<>();
            for (ProducerState s : e.getValue().activeProducers()) {
                list.add(producerJson(s));
            }
            out.put(e.getKey().toString(), list);
        }
        return out;
    }

    static List<TopicPartition> partitions(String topic, int n) {
        List<TopicPartition> out = new ArrayList<>();
        for (int p = 0; p < n; p++) {
            out.add(new TopicPartition(topic, p));
        }
        return out;
    }

    /** Send and wait for the acknowledgement; the metadata as JSON. */
    static Map<String, Object> sendSync(KafkaProducer<byte[], byte[]> producer, ProducerRecord<byte[], byte[]> rec)
            throws Exception {
        RecordMetadata md = producer.send(rec).get(40, TimeUnit.SECONDS);
        return obj("partition", md.partition(), "offset", md.offset());
    }

    /** Send a batch of string values to one partition and flush; the acknowledged offsets. */
    static List<Object> sendValues(KafkaProducer<byte[], byte[]> producer, String topic, int partition,
                                   List<String> values) throws Exception {
        List<Future<RecordMetadata>> futures = new ArrayList<>();
        for (String v : values) {
            futures.add(producer.send(new ProducerRecord<>(topic, partition, bytes("k-" + v), bytes(v))));
        }
        producer.flush();
        List<Object> offsets = new ArrayList<>();
        for (Future<RecordMetadata> f : futures) {
            offsets.add(f.get(40, TimeUnit.SECONDS).offset());
        }
        return offsets;
    }

    static List<String> names(String prefix, int n) {
        List<String> out = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            out.add(prefix + i);
        }
        return out;
    }

    // ------------------------------------------------------------------------------------------------------------
    // 1. round trip: idempotent produce with keys, headers, null values, a codec; consume back in assign mode

    void roundtrip() throws Exception {
        String topic = opts.get("topic");
        int count = intOpt("count", 500);
        int nparts = intOpt("partitions", 3);
        String compression = opt("compression", "none");
        long seed = Long.parseLong(opt("seed", "7"));
        List<TopicPartition> tps = partitions(topic, nparts);
        try (Admin admin = admin()) {
            step("create_topic", () -> {
                createTopic(admin, topic, nparts);
                return null;
            });
            Random rnd = new Random(seed);
            long baseTs = System.currentTimeMillis() - 60_000;
            List<ProducerRecord<byte[], byte[]>> sent = new ArrayList<>();
            for (int i = 0; i < count; i++) {
                byte[] key = i % 7 == 3 ? null : bytes("key-" + i);
                byte[] value;
                if (i % 5 == 2) {
                    value = null;
                } else if (i % 11 == 4) {
                    value = new byte[0];
                } else {
                    // compressible text then random bytes: every codec has work to do
                    byte[] text = bytes(("value-" + i + "-").repeat(1 + rnd.nextInt(20)));
                    byte[] noise = new byte[rnd.nextInt(200)];
                    rnd.nextBytes(noise);
                    value = new byte[text.length + noise.length];
                    System.arraycopy(text, 0, value, 0, text.length);
                    System.arraycopy(noise, 0, value, text.length, noise.length);
                }
                List<Header> headers = new ArrayList<>();
                if (i % 3 == 0) {
                    headers.add(new RecordHeader("h", bytes("a-" + i)));
                    headers.add(new RecordHeader("h", bytes("b-" + i))); // repeated key, order kept
                    headers.add(new RecordHeader("null-value", null));
                    headers.add(new RecordHeader("empty", new byte[0]));
                }
                sent.add(new ProducerRecord<>(topic, i % nparts, baseTs + i, key, value, headers));
            }
            List<RecordMetadata> acked = new ArrayList<>();
            step("produce", () -> {
                try (KafkaProducer<byte[], byte[]> producer = producer("interop-roundtrip",
                        Map.of(ProducerConfig.COMPRESSION_TYPE_CONFIG, compression,
                                ProducerConfig.BATCH_SIZE_CONFIG, "16384"))) {
                    List<Future<RecordMetadata>> futures = new ArrayList<>();
                    for (ProducerRecord<byte[], byte[]> r : sent) {
                        futures.add(producer.send(r));
                    }
                    producer.flush();
                    for (Future<RecordMetadata> f : futures) {
                        acked.add(f.get(40, TimeUnit.SECONDS));
                    }
                    Map<String, Object> metrics = new TreeMap<>();
                    for (var e : producer.metrics().entrySet()) {
                        String n = e.getKey().name();
                        if (e.getKey().group().equals("producer-metrics") && (n.equals("record-error-total")
                                || n.equals("record-retry-total") || n.equals("compression-rate-avg")
                                || n.equals("batch-split-total"))) {
                            metrics.put(n, e.getValue().metricValue());
                        }
                    }
                    return metrics;
                }
            });
            List<Object> produced = new ArrayList<>();
            for (int i = 0; i < acked.size(); i++) {
                ProducerRecord<byte[], byte[]> r = sent.get(i);
                List<Object> headers = new ArrayList<>();
                for (Header h : r.headers()) {
                    headers.add(Arrays.asList(h.key(), h.value()));
                }
                produced.add(obj("partition", acked.get(i).partition(), "offset", acked.get(i).offset(),
                        "key", r.key(), "value", r.value(), "headers", headers, "timestamp", r.timestamp()));
            }
            put("produced", produced);
            step("describe_producers", () -> describeProducers(admin, tps));
            List<ConsumerRecord<byte[], byte[]>> got = new ArrayList<>();
            step("consume", () -> {
                got.addAll(readAll(tps, "read_uncommitted"));
                return got.size();
            });
            // compare exactly, in the JVM: each acknowledged (partition, offset) holds what was sent, nothing else
            Map<String, ConsumerRecord<byte[], byte[]>> byPos = new HashMap<>();
            for (ConsumerRecord<byte[], byte[]> r : got) {
                byPos.put(r.partition() + "@" + r.offset(), r);
            }
            List<Object> mismatches = new ArrayList<>();
            Set<String> expected = new HashSet<>();
            for (int i = 0; i < acked.size(); i++) {
                String pos = acked.get(i).partition() + "@" + acked.get(i).offset();
                expected.add(pos);
                ProducerRecord<byte[], byte[]> s = sent.get(i);
                ConsumerRecord<byte[], byte[]> c = byPos.get(pos);
                String why = null;
                if (c == null) {
                    why = "missing";
                } else if (!Arrays.equals(s.key(), c.key())) {
                    why = "key";
                } else if (!Arrays.equals(s.value(), c.value())) {
                    why = "value";
                } else if (s.timestamp() != c.timestamp() || !c.timestampType().name.equals("CreateTime")) {
                    why = "timestamp";
                } else if (!sameHeaders(s.headers(), c.headers())) {
                    why = "headers";
                }
                if (why != null && mismatches.size() < 20) {
                    mismatches.add(obj("index", i, "position", pos, "why", why));
                }
            }
            List<Object> extra = new ArrayList<>();
            for (ConsumerRecord<byte[], byte[]> r : got) {
                if (!expected.contains(r.partition() + "@" + r.offset())) {
                    extra.add(recordJson(r));
                }
            }
            put("compare", obj("sent", sent.size(), "acked", acked.size(), "consumed", got.size(),
                    "mismatches", mismatches, "extra", extra));
        }
    }

    static boolean sameHeaders(Iterable<Header> a, Iterable<Header> b) {
        List<Header> la = new ArrayList<>();
        a.forEach(la::add);
        List<Header> lb = new ArrayList<>();
        b.forEach(lb::add);
        if (la.size() != lb.size()) {
            return false;
        }
        for (int i = 0; i < la.size(); i++) {
            if (!la.get(i).key().equals(lb.get(i).key()) || !Arrays.equals(la.get(i).value(), lb.get(i).value())) {
                return false;
            }
        }
        return true;
    }

    /** Read every partition of a topic to its end and print the records (for records another client wrote). */
    void consume() {
        String topic = opts.get("topic");
        int nparts = intOpt("partitions", 1);
        String isolation = opt("isolation", "read_uncommitted");
        step("consume", () -> {
            List<Object> recs = new ArrayList<>();
            for (ConsumerRecord<byte[], byte[]> r : readAll(partitions(topic, nparts), isolation)) {
                recs.add(recordJson(r));
            }
            return recs;
        });
    }

    /**
     * KIP-320 position validation: seek with a leader epoch makes the consumer ask OffsetsForLeaderEpoch where
     * that epoch ends before it fetches. For each --seeks entry "offset:epoch", the offsets read from there
     * until the position reaches --end (or 8 s pass), and the position then. Without validation a seek past the
     * end would be OFFSET_OUT_OF_RANGE and a reset to the beginning: everything read again.
     */
    void epochValidate() {
        String topic = opts.get("topic");
        long end = Long.parseLong(opts.get("end"));
        TopicPartition tp = new TopicPartition(topic, 0);
        for (String seek : opts.get("seeks").split(",")) {
            String[] parts = seek.split(":");
            long offset = Long.parseLong(parts[0]);
            int epoch = Integer.parseInt(parts[1]);
            step("seek_" + seek, () -> {
                List<Long> read = new ArrayList<>();
                try (KafkaConsumer<byte[], byte[]> c = consumer(null, "read_uncommitted", Map.of())) {
                    c.assign(List.of(tp));
                    c.seek(tp, new OffsetAndMetadata(offset, Optional.of(epoch), ""));
                    long deadline = System.currentTimeMillis() + 8_000;
                    while (System.currentTimeMillis() < deadline) {
                        for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(200))) {
                            read.add(r.offset());
                        }
                        if (c.position(tp) == end) {
                            break;
                        }
                    }
                    return obj("read", read, "position", c.position(tp));
                }
            });
        }
    }

    // ------------------------------------------------------------------------------------------------------------
    // 2. AdminClient

    void adminScenario() throws Exception {
        String topic = opts.get("topic");
        String other = topic + "-validate-only";
        TopicPartition tp0 = new TopicPartition(topic, 0);
        ConfigResource res = new ConfigResource(ConfigResource.Type.TOPIC, topic);
        try (Admin admin = admin()) {
            step("create", () -> {
                NewTopic nt = new NewTopic(topic, 3, (short) 1).configs(Map.of("retention.ms", "3600000"));
                admin.createTopics(List.of(nt)).all().get(20, TimeUnit.SECONDS);
                return null;
            });
            step("create_again", () -> {
                admin.createTopics(List.of(new NewTopic(topic, 3, (short) 1))).all().get(20, TimeUnit.SECONDS);
                return null;
            });
            step("create_rf2", () -> {
                admin.createTopics(List.of(new NewTopic(topic + "-rf2", 1, (short) 2))).all()
                        .get(20, TimeUnit.SECONDS);
                return null;
            });
            step("create_validate_only", () -> {
                admin.createTopics(List.of(new NewTopic(other, 2, (short) 1)),
                        new CreateTopicsOptions().validateOnly(true)).all().get(20, TimeUnit.SECONDS);
                return null;
            });
            step("list_topics", () -> {
                List<String> names = new ArrayList<>(admin.listTopics().names().get(20, TimeUnit.SECONDS));
                names.sort(null);
                return names;
            });
            step("describe_topic", () -> {
                TopicDescription d = admin.describeTopics(List.of(topic)).allTopicNames().get(20, TimeUnit.SECONDS)
                        .get(topic);
                List<Object> parts = new ArrayList<>();
                for (TopicPartitionInfo p : d.partitions()) {
                    parts.add(obj("partition", p.partition(), "leader", p.leader() == null ? null : p.leader().id(),
                            "replicas", p.replicas().stream().map(Node::id).toList(),
                            "isr", p.isr().stream().map(Node::id).toList()));
                }
                return obj("name", d.name(), "internal", d.isInternal(), "topic_id", d.topicId().toString(),
                        "partitions", parts);
            });
            step("describe_configs", () -> configJson(admin, res));
            step("alter_configs", () -> {
                Map<ConfigResource, Collection<AlterConfigOp>> ops = Map.of(res, List.of(
                        new AlterConfigOp(new ConfigEntry("retention.ms", "7200000"), AlterConfigOp.OpType.SET),
                        new AlterConfigOp(new ConfigEntry("max.message.bytes", "2000000"), AlterConfigOp.OpType.SET),
                        new AlterConfigOp(new ConfigEntry("segment.ms", ""), AlterConfigOp.OpType.DELETE)));
                admin.incrementalAlterConfigs(ops).all().get(20, TimeUnit.SECONDS);
                return null;
            });
            step("describe_configs_after", () -> configJson(admin, res));
            step("alter_configs_delete", () -> {
                admin.incrementalAlterConfigs(Map.of(res, List.of(new AlterConfigOp(
                        new ConfigEntry("retention.ms", ""), AlterConfigOp.OpType.DELETE))))
                        .all().get(20, TimeUnit.SECONDS);
                return configJson(admin, res);
            });
            step("alter_configs_invalid_value", () -> {
                admin.incrementalAlterConfigs(Map.of(res, List.of(new AlterConfigOp(
                        new ConfigEntry("retention.ms", "not-a-number"), AlterConfigOp.OpType.SET))))
                        .all().get(20, TimeUnit.SECONDS);
                return null;
            });
            step("alter_configs_unknown_key", () -> {
                admin.incrementalAlterConfigs(Map.of(res, List.of(new AlterConfigOp(
                        new ConfigEntry("no.such.config", "1"), AlterConfigOp.OpType.SET))))
                        .all().get(20, TimeUnit.SECONDS);
                return null;
            });
            step("describe_broker_configs", () -> {
                ConfigResource broker = new ConfigResource(ConfigResource.Type.BROKER, "0");
                Config c = admin.describeConfigs(List.of(broker)).all().get(20, TimeUnit.SECONDS).get(broker);
                Map<String, Object> out = new TreeMap<>();
                for (String k : List.of("num.partitions", "log.segment.bytes", "message.max.bytes",
                        "auto.create.topics.enable")) {
                    ConfigEntry e = c.get(k);
                    out.put(k, e == null ? null : e.value());
                }
                out.put("entries", c.entries().size());
                return out;
            });

            // ten records with known timestamps; the seventh carries the largest
            long base = System.currentTimeMillis() - 100_000;
            step("produce", () -> {
                try (KafkaProducer<byte[], byte[]> p = producer("interop-admin-produce", Map.of())) {
                    List<Object> offs = new ArrayList<>();
                    for (int i = 0; i < 10; i++) {
                        long ts = i == 6 ? base + 90_000 : base + i * 1000L;
                        offs.add(sendSync(p, new ProducerRecord<>(topic, 0, ts, bytes("k" + i), bytes("v" + i)))
                                .get("offset"));
                    }
                    return offs;
                }
            });
            put("base_timestamp", base);
            step("list_offsets", () -> listOffsetsJson(admin, tp0, base));
            step("delete_records", () -> admin.deleteRecords(Map.of(tp0, RecordsToDelete.beforeOffset(4)))
                    .lowWatermarks().get(tp0).get(20, TimeUnit.SECONDS).lowWatermark());
            step("list_offsets_after_delete", () -> listOffsetsJson(admin, tp0, base));
            step("delete_records_beyond_end", () -> admin.deleteRecords(
                    Map.of(tp0, RecordsToDelete.beforeOffset(100))).lowWatermarks().get(tp0)
                    .get(20, TimeUnit.SECONDS).lowWatermark());
            step("consume_after_delete", () -> valuesByPartition(readAll(List.of(tp0), "read_uncommitted")));
            step("describe_cluster", () -> {
                DescribeClusterResult r = admin.describeCluster();
                List<Object> nodes = new ArrayList<>();
                for (Node n : r.nodes().get(20, TimeUnit.SECONDS)) {
                    nodes.add(obj("id", n.id(), "host", n.host(), "port", n.port(), "rack", n.rack()));
                }
                Node ctl = r.controller().get(20, TimeUnit.SECONDS);
                return obj("cluster_id", r.clusterId().get(20, TimeUnit.SECONDS), "nodes", nodes,
                        "controller", ctl == null ? null : ctl.id());
            });
            step("describe_log_dirs", () -> {
                Map<Integer, Map<String, LogDirDescription>> d = admin.describeLogDirs(List.of(0))
                        .allDescriptions().get(20, TimeUnit.SECONDS);
                Map<String, Object> out = new TreeMap<>();
                for (Map.Entry<String, LogDirDescription> e : d.getOrDefault(0, Map.of()).entrySet()) {
                    Map<String, Object> sizes = new TreeMap<>();
                    e.getValue().replicaInfos().forEach((k, v) -> {
                        if (k.topic().equals(topic)) {
                            sizes.put(k.toString(), v.size());
                        }
                    });
                    out.put(e.getKey(), obj("error", e.getValue().error() == null ? null
                            : e.getValue().error().getClass().getName(), "replicas", sizes));
                }
                return out;
            });
            step("create_partitions", () -> {
                admin.createPartitions(Map.of(topic, NewPartitions.increaseTo(4))).all().get(20, TimeUnit.SECONDS);
                return admin.describeTopics(List.of(topic)).allTopicNames().get(20, TimeUnit.SECONDS).get(topic)
                        .partitions().size();
            });
            step("delete_topic", () -> {
                admin.deleteTopics(List.of(topic)).all().get(20, TimeUnit.SECONDS);
                return null;
            });
            step("list_topics_after_delete", () -> {
                List<String> names = new ArrayList<>(admin.listTopics().names().get(20, TimeUnit.SECONDS));
                names.sort(null);
                return names;
            });
            step("describe_deleted_topic", () -> admin.describeTopics(List.of(topic)).allTopicNames()
                    .get(20, TimeUnit.SECONDS).get(topic).partitions().size());
        }
    }

    Map<String, Object> configJson(Admin admin, ConfigResource res) throws Exception {
        Config c = admin.describeConfigs(List.of(res)).all().get(20, TimeUnit.SECONDS).get(res);
        Map<String, Object> out = new TreeMap<>();
        for (ConfigEntry e : c.entries()) {
            out.put(e.name(), obj("value", e.value(), "source", e.source().name(), "read_only", e.isReadOnly(),
                    "sensitive", e.isSensitive()));
        }
        return out;
    }

    Map<String, Object> listOffsetsJson(Admin admin, TopicPartition tp, long base) throws Exception {
        Map<String, OffsetSpec> specs = new LinkedHashMap<>();
        specs.put("earliest", OffsetSpec.earliest());
        specs.put("latest", OffsetSpec.latest());
        specs.put("max_timestamp", OffsetSpec.maxTimestamp());
        specs.put("for_timestamp_base_plus_3500", OffsetSpec.forTimestamp(base + 3500));
        specs.put("for_timestamp_future", OffsetSpec.forTimestamp(base + 1_000_000));
        Map<String, Object> out = new LinkedHashMap<>();
        for (Map.Entry<String, OffsetSpec> e : specs.entrySet()) {
            ListOffsetsResultInfo info = admin.listOffsets(Map.of(tp, e.getValue())).partitionResult(tp)
                    .get(20, TimeUnit.SECONDS);
            out.put(e.getKey(), obj("offset", info.offset(), "timestamp", info.timestamp(),
                    "leader_epoch", info.leaderEpoch()));
        }
        return out;
    }

    // ------------------------------------------------------------------------------------------------------------
    // 3. transactions

    /** Commit visible to read_committed, abort invisible, an open transaction holds the LSO, offsets in a txn. */
    void txnCommitAbort() throws Exception {
        String topic = opts.get("topic");
        String txnId = opt("txn-id", topic + "-txn");
        String group = topic + "-group";
        TopicPartition tp0 = new TopicPartition(topic, 0);
        TopicPartition tp1 = new TopicPartition(topic, 1);
        List<TopicPartition> tps = List.of(tp0, tp1);
        try (Admin admin = admin(); KafkaProducer<byte[], byte[]> p = txProducer(txnId, 30000)) {
            step("create_topic", () -> {
                createTopic(admin, topic, 2);
                return null;
            });
            step("init", () -> {
                p.initTransactions();
                return null;
            });
            step("commit1", () -> {
                p.beginTransaction();
                List<Object> offs = new ArrayList<>();
                offs.add(sendValues(p, topic, 0, names("c1-p0-", 4)));
                offs.add(sendValues(p, topic, 1, names("c1-p1-", 4)));
                p.sendOffsetsToTransaction(Map.of(tp0, new OffsetAndMetadata(42, "committed-in-txn")),
                        new ConsumerGroupMetadata(group));
                p.commitTransaction();
                return offs;
            });
            step("abort1", () -> {
                p.beginTransaction();
                List<Object> offs = new ArrayList<>();
                offs.add(sendValues(p, topic, 0, names("a1-p0-", 3)));
                offs.add(sendValues(p, topic, 1, names("a1-p1-", 3)));
                p.sendOffsetsToTransaction(Map.of(tp0, new OffsetAndMetadata(99, "aborted")),
                        new ConsumerGroupMetadata(group));
                p.abortTransaction();
                return offs;
            });
            step("open_txn", () -> {
                p.beginTransaction();
                return sendValues(p, topic, 0, names("c2-p0-", 2));
            });
            step("offsets_while_open", () -> offsets(admin, tp0));
            step("read_committed_while_open", () -> valuesByPartition(readAll(tps, "read_committed")));
            step("describe_txn_while_open", () -> describeTxn(admin, txnId));
            step("commit2", () -> {
                p.commitTransaction();
                return null;
            });
            step("offsets_after_commit", () -> offsets(admin, tp0));
            step("read_committed", () -> valuesByPartition(readAll(tps, "read_committed")));
            step("read_uncommitted", () -> valuesByPartition(readAll(tps, "read_uncommitted")));
            step("group_offsets", () -> {
                Map<String, Object> out = new TreeMap<>();
                admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get(20, TimeUnit.SECONDS)
                        .forEach((k, v) -> out.put(k.toString(), v == null ? null
                                : obj("offset", v.offset(), "metadata", v.metadata())));
                return out;
            });
            step("describe_txn_after", () -> describeTxn(admin, txnId));
        }
    }

    /**
     * A second instance with the same transactional.id fences the first. Two orders: the zombie commits straight
     * away; the zombie first sends again, then commits, then aborts.
     */
    void txnFence() throws Exception {
        String topic = opts.get("topic");
        List<TopicPartition> tps = partitions(topic, 1);
        try (Admin admin = admin()) {
            step("create_topic", () -> {
                createTopic(admin, topic, 1);
                return null;
            });
            for (String variant : List.of("commit_first", "send_first")) {
                String txnId = topic + "-" + variant;
                KafkaProducer<byte[], byte[]> zombie = txProducer(txnId, 30000);
                KafkaProducer<byte[], byte[]> fresh = txProducer(txnId, 30000);
                try {
                    step(variant + ".zombie_init_send", () -> {
                        zombie.initTransactions();
                        zombie.beginTransaction();
                        return sendValues(zombie, topic, 0, List.of(variant + "-zombie-1"));
                    });
                    step(variant + ".txn_before_fence", () -> describeTxn(admin, txnId));
                    step(variant + ".fresh_init", () -> {
                        fresh.initTransactions();
                        return null;
                    });
                    step(variant + ".txn_after_fence", () -> describeTxn(admin, txnId));
                    if (variant.equals("send_first")) {
                        step(variant + ".zombie_send", () -> sendSync(zombie,
                                new ProducerRecord<>(topic, 0, bytes("k"), bytes(variant + "-zombie-2"))));
                    }
                    step(variant + ".zombie_commit", () -> {
                        zombie.commitTransaction();
                        return null;
                    });
                    step(variant + ".zombie_abort", () -> {
                        zombie.abortTransaction();
                        return null;
                    });
                    step(variant + ".fresh_commit", () -> {
                        fresh.beginTransaction();
                        List<Object> offs = sendValues(fresh, topic, 0, List.of(variant + "-fresh-1"));
                        fresh.commitTransaction();
                        return offs;
                    });
                    step(variant + ".txn_after", () -> describeTxn(admin, txnId));
                } finally {
                    zombie.close(Duration.ofSeconds(5));
                    fresh.close(Duration.ofSeconds(5));
                }
            }
            step("read_committed", () -> valuesByPartition(readAll(tps, "read_committed")));
            step("read_uncommitted", () -> valuesByPartition(readAll(tps, "read_uncommitted")));
        }
    }

    /**
     * KAFKA-9803 as oncelog implements it: the coordinator aborts a transaction that outlived
     * transaction.timeout.ms; its owner gets an abortable error, aborts, and goes on with the next transaction.
     * --mode send: the first call after the timeout is a send; commit: a commitTransaction; offsets: the timed-out
     * transaction only added offsets (no data), and the next call is a commit.
     */
    void txnTimeout() throws Exception {
        String topic = opts.get("topic");
        String mode = opt("mode", "send");
        String txnId = topic + "-txn";
        int timeoutMs = intOpt("txn-timeout-ms", 2000);
        long sleepMs = Long.parseLong(opt("sleep-ms", "3500"));
        TopicPartition tp0 = new TopicPartition(topic, 0);
        List<TopicPartition> tps = List.of(tp0);
        try (Admin admin = admin(); KafkaProducer<byte[], byte[]> p = txProducer(txnId, timeoutMs)) {
            step("create_topic", () -> {
                createTopic(admin, topic, 1);
                return null;
            });
            step("init", () -> {
                p.initTransactions();
                return null;
            });
            step("begin_and_write", () -> {
                p.beginTransaction();
                if (mode.equals("offsets")) {
                    p.sendOffsetsToTransaction(Map.of(tp0, new OffsetAndMetadata(7)),
                            new ConsumerGroupMetadata(topic + "-group"));
                    return null;
                }
                return sendValues(p, topic, 0, List.of("t1-r1"));
            });
            step("txn_before_timeout", () -> describeTxn(admin, txnId));
            sleep(sleepMs);
            step("txn_after_timeout", () -> describeTxn(admin, txnId));
            step("offsets_after_timeout", () -> offsets(admin, tp0));
            if (mode.equals("send")) {
                step("send_after_timeout", () -> sendSync(p,
                        new ProducerRecord<>(topic, 0, bytes("k"), bytes("t1-r2"))));
                // kafka-clients 4.4.0 (Sender.failBatch) completes the batch's future before
                // TransactionManager.handleFailedBatch records the abortable error. An application that calls
                // commit/abort the instant the future fails can win that race: the transaction is then already
                // "completing", the client does not flag its epoch bump, the abort sends no InitProducerId and the
                // next transaction fails once more (UNKNOWN_PRODUCER_ID) before a second abort bumps the epoch.
                // That race is the client's, not the broker's: let the sender thread finish first.
                sleep(Long.parseLong(opt("settle-ms", "200")));
            }
            step("commit_after_timeout", () -> {
                p.commitTransaction();
                return null;
            });
            step("abort", () -> {
                p.abortTransaction();
                return null;
            });
            step("txn_after_abort", () -> describeTxn(admin, txnId));
            step("next_txn", () -> {
                p.beginTransaction();
                List<Object> offs = sendValues(p, topic, 0, List.of("t2-r1"));
                p.commitTransaction();
                return offs;
            });
            step("txn_after_next", () -> describeTxn(admin, txnId));
            if (!ok("next_txn")) {
                // not what KAFKA-9803 asks for, but tells whether the producer recovers at all: abort once more
                step("abort_again", () -> {
                    p.abortTransaction();
                    return null;
                });
                step("txn_after_abort_again", () -> describeTxn(admin, txnId));
                step("retry_txn", () -> {
                    p.beginTransaction();
                    List<Object> offs = sendValues(p, topic, 0, List.of("t3-r1"));
                    p.commitTransaction();
                    return offs;
                });
            }
            step("offsets_after_next", () -> offsets(admin, tp0));
            step("read_committed", () -> valuesByPartition(readAll(tps, "read_committed")));
            step("read_uncommitted", () -> valuesByPartition(readAll(tps, "read_uncommitted")));
        }
    }

    // ------------------------------------------------------------------------------------------------------------
    // 4. consumer groups (classic protocol): subscribe, commit, a restarted consumer resumes

    /**
     * --phase first: create the topic, write 10 records per partition, a first member joins, reads a little and
     * commits {p0: 4, p1: 6} explicitly, then leaves. --phase second: a new member of the same group resumes from
     * the committed offsets and reads to the end; the group is listed and deleted. --phase all: both (the driver
     * restarts the broker between two separate runs to check committed offsets survive it).
     */
    void groups() throws Exception {
        String topic = opts.get("topic");
        String phase = opt("phase", "all");
        String group = topic + "-group";
        List<TopicPartition> tps = partitions(topic, 2);
        int perPartition = 10;
        Map<TopicPartition, OffsetAndMetadata> commit = Map.of(
                tps.get(0), new OffsetAndMetadata(4, "interop-first"),
                tps.get(1), new OffsetAndMetadata(6, "interop-first"));
        Map<String, String> cconf = Map.of(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "3",
                ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, "10000",
                ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, "500");
        try (Admin admin = admin()) {
            if (!phase.equals("second")) {
                step("create_topic", () -> {
                    createTopic(admin, topic, 2);
                    return null;
                });
                step("produce", () -> {
                    try (KafkaProducer<byte[], byte[]> p = producer("interop-groups-produce", Map.of())) {
                        for (int part = 0; part < 2; part++) {
                            sendValues(p, topic, part, names("g-p" + part + "-", perPartition));
                        }
                    }
                    return null;
                });
                step("first_consumer", () -> {
                    List<Object> seen = new ArrayList<>();
                    try (KafkaConsumer<byte[], byte[]> c = consumer(group, "read_uncommitted", cconf)) {
                        c.subscribe(List.of(topic));
                        long deadline = System.currentTimeMillis() + 30_000;
                        while (seen.size() < 3 && System.currentTimeMillis() < deadline) {
                            for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(200))) {
                                seen.add(Arrays.asList(r.partition(), r.offset(), str(r.value())));
                            }
                        }
                        c.commitSync(commit, Duration.ofSeconds(20));
                        Map<String, Object> fromConsumer = new TreeMap<>();
                        c.committed(new HashSet<>(tps), Duration.ofSeconds(20)).forEach((k, v) ->
                                fromConsumer.put(k.toString(), v == null ? null
                                        : obj("offset", v.offset(), "metadata", v.metadata())));
                        return obj("seen", seen, "assignment", tpStrings(c.assignment()),
                                "committed", fromConsumer, "group_while_active", groupJson(admin, group),
                                "generation", c.groupMetadata().generationId(),
                                "member_id", c.groupMetadata().memberId());
                    }
                });
                step("group_after_close", () -> groupJson(admin, group));
                step("group_offsets", () -> groupOffsets(admin, group));
            }
            if (phase.equals("first")) {
                return;
            }
            step("second_consumer", () -> {
                long expected = 0;
                for (Object o : groupOffsets(admin, group).values()) {
                    expected += perPartition - ((Number) o).longValue();
                }
                List<Object> seen = new ArrayList<>();
                try (KafkaConsumer<byte[], byte[]> c = consumer(group, "read_uncommitted", cconf)) {
                    c.subscribe(List.of(topic));
                    long deadline = System.currentTimeMillis() + 30_000;
                    while (seen.size() < expected && System.currentTimeMillis() < deadline) {
                        for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(200))) {
                            seen.add(Arrays.asList(r.partition(), r.offset(), str(r.value())));
                        }
                    }
                    // a little longer: anything beyond the expected count is a duplicate or a stray
                    for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(300))) {
                        seen.add(Arrays.asList(r.partition(), r.offset(), str(r.value())));
                    }
                    c.commitSync(Duration.ofSeconds(20));
                    return obj("seen", seen, "expected_count", expected, "generation",
                            c.groupMetadata().generationId());
                }
            });
            step("group_offsets_final", () -> groupOffsets(admin, group));
            step("list_groups", () -> {
                List<Object> out = new ArrayList<>();
                for (GroupListing g : admin.listGroups().all().get(20, TimeUnit.SECONDS)) {
                    if (g.groupId().equals(group)) {
                        out.add(obj("group_id", g.groupId(), "type", g.type().map(Enum::name).orElse(null),
                                "protocol", g.protocol(), "state", g.groupState().map(Enum::name).orElse(null)));
                    }
                }
                return out;
            });
            step("delete_group", () -> {
                admin.deleteConsumerGroups(List.of(group)).all().get(20, TimeUnit.SECONDS);
                return null;
            });
            step("group_offsets_after_delete", () -> groupOffsets(admin, group));
        }
    }

    Map<String, Object> groupJson(Admin admin, String group) throws Exception {
        ConsumerGroupDescription d = admin.describeConsumerGroups(List.of(group)).describedGroups().get(group)
                .get(20, TimeUnit.SECONDS);
        List<Object> members = new ArrayList<>();
        for (MemberDescription m : d.members()) {
            members.add(obj("member_id", m.consumerId(), "client_id", m.clientId(), "host", m.host(),
                    "assignment", tpStrings(m.assignment().topicPartitions())));
        }
        return obj("state", d.groupState().name(), "type", d.type().name(), "assignor", d.partitionAssignor(),
                "coordinator", d.coordinator() == null ? null : d.coordinator().id(), "members", members);
    }

    Map<String, Object> groupOffsets(Admin admin, String group) throws Exception {
        Map<String, Object> out = new TreeMap<>();
        admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get(20, TimeUnit.SECONDS)
                .forEach((k, v) -> out.put(k.toString(), v == null ? null : v.offset()));
        return out;
    }

    // ------------------------------------------------------------------------------------------------------------
    // 5. KIP-664: DescribeProducers, ListTransactions, DescribeTransactions, and the admin abort of a transaction

    void kip664() throws Exception {
        String topic = opts.get("topic");
        String txnId = topic + "-x";
        String hangingId = topic + "-y";
        TopicPartition tp0 = new TopicPartition(topic, 0);
        TopicPartition tp1 = new TopicPartition(topic, 1);
        List<TopicPartition> tps = List.of(tp0, tp1);
        try (Admin admin = admin();
             KafkaProducer<byte[], byte[]> x = txProducer(txnId, 60000);
             KafkaProducer<byte[], byte[]> idem = producer("interop-idempotent", Map.of());
             KafkaProducer<byte[], byte[]> y = txProducer(hangingId, 60000)) {
            step("create_topic", () -> {
                createTopic(admin, topic, 2);
                return null;
            });
            step("open_txn", () -> {
                x.initTransactions();
                x.beginTransaction();
                return sendValues(x, topic, 0, names("x-", 3));
            });
            step("idempotent_produce", () -> sendValues(idem, topic, 1, names("i-", 2)));
            step("describe_producers", () -> describeProducers(admin, tps));
            step("list_transactions", () -> listTxns(admin, new ListTransactionsOptions()));
            step("list_transactions_ongoing", () -> listTxns(admin,
                    new ListTransactionsOptions().filterStates(List.of(TransactionState.ONGOING))));
            step("list_transactions_complete_commit", () -> listTxns(admin,
                    new ListTransactionsOptions().filterStates(List.of(TransactionState.COMPLETE_COMMIT))));
            step("list_transactions_by_producer", () -> {
                long pid = admin.describeTransactions(List.of(txnId)).description(txnId)
                        .get(20, TimeUnit.SECONDS).producerId();
                return listTxns(admin, new ListTransactionsOptions().filterProducerIds(List.of(pid)));
            });
            step("list_transactions_by_other_producer", () -> listTxns(admin,
                    new ListTransactionsOptions().filterProducerIds(List.of(987654321L))));
            step("list_transactions_longer_than_1h", () -> listTxns(admin,
                    new ListTransactionsOptions().filterOnDuration(3_600_000L)));
            step("list_transactions_longer_than_0", () -> listTxns(admin,
                    new ListTransactionsOptions().filterOnDuration(0L)));
            step("describe_transaction", () -> describeTxn(admin, txnId));
            step("describe_unknown_transaction", () -> describeTxn(admin, topic + "-no-such-id"));
            step("commit", () -> {
                x.commitTransaction();
                return null;
            });
            step("describe_transaction_after_commit", () -> describeTxn(admin, txnId));
            step("describe_producers_after_commit", () -> describeProducers(admin, tps));
            step("list_transactions_after_commit", () -> listTxns(admin, new ListTransactionsOptions()));

            // a transaction the coordinator still tracks, aborted on the partition with Admin.abortTransaction
            // (WriteTxnMarkers to the leader), as an operator would abort a hanging one
            step("hanging_open", () -> {
                y.initTransactions();
                y.beginTransaction();
                return sendValues(y, topic, 1, names("y-", 2));
            });
            step("hanging_offsets_before", () -> offsets(admin, tp1));
            Map<String, Object> spec = new LinkedHashMap<>();
            step("hanging_describe_producers", () -> {
                for (ProducerState s : admin.describeProducers(List.of(tp1)).partitionResult(tp1)
                        .get(20, TimeUnit.SECONDS).activeProducers()) {
                    if (s.currentTransactionStartOffset().isPresent()) {
                        spec.putAll(producerJson(s));
                    }
                }
                return spec;
            });
            step("admin_abort", () -> {
                long pid = (Long) spec.get("producer_id");
                int epoch = (Integer) spec.get("producer_epoch");
                OptionalInt ce = (OptionalInt) spec.get("coordinator_epoch");
                admin.abortTransaction(new AbortTransactionSpec(tp1, pid, (short) epoch, ce.orElse(0)))
                        .all().get(20, TimeUnit.SECONDS);
                return null;
            });
            step("hanging_offsets_after", () -> offsets(admin, tp1));
            step("hanging_describe_producers_after", () -> describeProducers(admin, List.of(tp1)));
            step("hanging_read_committed", () -> valuesByPartition(readAll(List.of(tp1), "read_committed")));
            step("hanging_txn_state", () -> describeTxn(admin, hangingId));
            step("hanging_producer_abort", () -> {
                y.abortTransaction();
                return null;
            });
            step("hanging_txn_state_after", () -> describeTxn(admin, hangingId));
            step("hanging_producer_next_txn", () -> {
                y.beginTransaction();
                List<Object> offs = sendValues(y, topic, 1, names("y2-", 1));
                y.commitTransaction();
                return offs;
            });
            step("read_committed", () -> valuesByPartition(readAll(tps, "read_committed")));
        }
    }

    List<Object> listTxns(Admin admin, ListTransactionsOptions o) throws Exception {
        List<Object> out = new ArrayList<>();
        for (TransactionListing l : admin.listTransactions(o).all().get(20, TimeUnit.SECONDS)) {
            out.add(obj("transactional_id", l.transactionalId(), "producer_id", l.producerId(),
                    "state", l.state().name()));
        }
        out.sort((a, b) -> ((String) ((Map<?, ?>) a).get("transactional_id"))
                .compareTo((String) ((Map<?, ?>) b).get("transactional_id")));
        return out;
    }

    // ------------------------------------------------------------------------------------------------------------

    /** Just enough JSON: maps, collections, strings, numbers, booleans, null; byte[] as base64; Optional* unwrapped. */
    static final class Json {
        static String write(Object o) {
            StringBuilder sb = new StringBuilder();
            write(sb, o);
            return sb.toString();
        }

        static void write(StringBuilder sb, Object o) {
            if (o == null) {
                sb.append("null");
            } else if (o instanceof Map<?, ?> m) {
                sb.append('{');
                boolean first = true;
                for (Map.Entry<?, ?> e : m.entrySet()) {
                    if (!first) {
                        sb.append(',');
                    }
                    first = false;
                    string(sb, String.valueOf(e.getKey()));
                    sb.append(':');
                    write(sb, e.getValue());
                }
                sb.append('}');
            } else if (o instanceof Collection<?> c) {
                sb.append('[');
                boolean first = true;
                for (Object x : c) {
                    if (!first) {
                        sb.append(',');
                    }
                    first = false;
                    write(sb, x);
                }
                sb.append(']');
            } else if (o instanceof byte[] b) {
                string(sb, Base64.getEncoder().encodeToString(b));
            } else if (o instanceof Boolean || o instanceof Integer || o instanceof Long || o instanceof Short) {
                sb.append(o);
            } else if (o instanceof Double d) {
                sb.append(d.isNaN() || d.isInfinite() ? "null" : d.toString());
            } else if (o instanceof Float f) {
                write(sb, f.doubleValue());
            } else if (o instanceof OptionalLong ol) {
                write(sb, ol.isPresent() ? ol.getAsLong() : null);
            } else if (o instanceof OptionalInt oi) {
                write(sb, oi.isPresent() ? oi.getAsInt() : null);
            } else if (o instanceof Optional<?> op) {
                write(sb, op.orElse(null));
            } else if (o instanceof Enum<?> e) {
                string(sb, e.name());
            } else {
                string(sb, o.toString());
            }
        }

        static void string(StringBuilder sb, String s) {
            sb.append('"');
            for (int i = 0; i < s.length(); i++) {
                char ch = s.charAt(i);
                switch (ch) {
                    case '"' -> sb.append("\\\"");
                    case '\\' -> sb.append("\\\\");
                    case '\n' -> sb.append("\\n");
                    case '\r' -> sb.append("\\r");
                    case '\t' -> sb.append("\\t");
                    default -> {
                        if (ch < 0x20) {
                            sb.append(String.format("\\u%04x", (int) ch));
                        } else {
                            sb.append(ch);
                        }
                    }
                }
            }
            sb.append('"');
        }
    }
    // ------------------------------------------------------------------------------------------------------------
    // produce-bench: throughput of the Java producer, driven by bench/produce_fetch.py --client java

    /**
     * Produces --mb MiB of 1 KiB records round-robin over --partitions partitions of an existing topic, with the
     * bench's settings (acks=all, linger 5 ms, 1 MB batches), idempotence per --idempotent. The Java client keeps up
     * to 5 requests in flight per connection with idempotence on, so it shows the broker-side cost of idempotence
     * without librdkafka's per-partition message cap.
     */
    void produceBench() throws Exception {
        String topic = opts.get("topic");
        int nparts = intOpt("partitions", 4);
        long count = (long) intOpt("mb", 256) * 1024;
        boolean idempotent = Boolean.parseBoolean(opt("idempotent", "true"));
        byte[] value = new byte[1024];
        Arrays.fill(value, (byte) 'x');
        long[] errors = new long[1];
        Map<String, String> extra = new HashMap<>();
        extra.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, Boolean.toString(idempotent));
        extra.put(ProducerConfig.BATCH_SIZE_CONFIG, "1000000");
        extra.put(ProducerConfig.BUFFER_MEMORY_CONFIG, Long.toString(1L << 30));
        extra.put(ProducerConfig.MAX_REQUEST_SIZE_CONFIG, "10485760");
        extra.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "120000");
        extra.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "120000");
        long start;
        long elapsed;
        try (KafkaProducer<byte[], byte[]> producer = producer("bench-producer", extra)) {
            producer.partitionsFor(topic);
            start = System.nanoTime();
            for (long i = 0; i < count; i++) {
                producer.send(new ProducerRecord<>(topic, (int) (i % nparts), null, value), (md, e) -> {
                    if (e != null) {
                        synchronized (errors) {
                            errors[0]++;
                        }
                    }
                });
            }
            producer.flush();
            elapsed = System.nanoTime() - start;
        }
        double seconds = elapsed / 1e9;
        put("records", count);
        put("seconds", seconds);
        put("mb_per_s", count * 1024 / seconds / 1e6);
        put("records_per_s", count / seconds);
        put("errors", errors[0]);
    }

}
