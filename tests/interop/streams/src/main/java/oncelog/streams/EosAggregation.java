package oncelog.streams;

import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.processor.StateRestoreListener;
import org.apache.kafka.streams.state.KeyValueStore;

import sun.misc.Signal;

/**
 * One Kafka Streams instance of an exactly_once_v2 aggregation, for oncelog's tests and benchmark.
 *
 * <p>Input records carry the value {@code "<group>,<amount>"} (the key is irrelevant). The topology re-keys
 * each record by its group, which makes Kafka Streams write it through a repartition topic
 * ({@code <application.id>-by-group-repartition}), and folds each group into the value {@code "<count>,<sum>"}
 * in a key-value store whose changelog ({@code <application.id>-totals-changelog}) is a compacted topic. Every
 * update of the table goes to the output topic. With the record cache off (the default here), every input
 * record gives exactly one output record, so a reader of the output can check each step.
 *
 * <p>Arguments are {@code --name value} pairs: bootstrap, application-id, state-dir, input, output (required);
 * commit-interval-ms (150), cache-bytes (0), threads (1), replication (1: internal topics' replication factor;
 * above 1 their min.insync.replicas is 2), and any number of {@code --config key=value} for the Streams
 * configuration (e.g. {@code topic.segment.bytes=65536} for the internal topics).
 *
 * <p>On stdout, one JSON object per line ({@code "event"} says which): started, state (every state change),
 * uncaught (an exception that ended a stream thread; the client is then shut down), restore_start,
 * restore_end (a store partition restored from its changelog, with the record count), closing and closed
 * (after SIGTERM or SIGINT; the process then exits with 0 if Kafka Streams closed cleanly, else 1). Kafka's own
 * logging goes to stderr.
 */
public final class EosAggregation {

    private static final PrintStream OUT = new PrintStream(System.out, true, StandardCharsets.UTF_8);

    private EosAggregation() {
    }

    public static void main(String[] argv) throws Exception {
        Map<String, String> args = new LinkedHashMap<>();
        Properties extra = new Properties();
        for (int i = 0; i + 1 < argv.length; i += 2) {
            String name = argv[i];
            if (!name.startsWith("--")) {
                throw new IllegalArgumentException("expected --name value pairs, got " + name);
            }
            if (name.equals("--config")) {
                int eq = argv[i + 1].indexOf('=');
                if (eq <= 0) {
                    throw new IllegalArgumentException("--config takes key=value, got " + argv[i + 1]);
                }
                extra.setProperty(argv[i + 1].substring(0, eq), argv[i + 1].substring(eq + 1));
            } else {
                args.put(name.substring(2), argv[i + 1]);
            }
        }
        String input = required(args, "input");
        String output = required(args, "output");
        Properties props = configuration(args);
        props.putAll(extra);

        KafkaStreams streams = new KafkaStreams(topology(input, output), props);
        streams.setStateListener((newState, oldState) -> emit("state", "old", oldState.name(), "new", newState.name()));
        streams.setUncaughtExceptionHandler(error -> {
            emit("uncaught", "thread", Thread.currentThread().getName(), "error", describe(error),
                    "stack", stack(error));
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        streams.setGlobalStateRestoreListener(new RestoreReport());

        // SIGTERM and SIGINT close the client from the main thread, which then exits with 0 after a clean close.
        CountDownLatch stop = new CountDownLatch(1);
        Signal.handle(new Signal("TERM"), signal -> stop.countDown());
        Signal.handle(new Signal("INT"), signal -> stop.countDown());

        emit("started", "application_id", props.getProperty(StreamsConfig.APPLICATION_ID_CONFIG),
                "state_dir", props.getProperty(StreamsConfig.STATE_DIR_CONFIG));
        streams.start();
        stop.await();
        emit("closing");
        boolean clean = streams.close(Duration.ofSeconds(60));
        emit("closed", "clean", Boolean.toString(clean), "state", streams.state().name());
        System.exit(clean ? 0 : 1);
    }

    static Topology topology(String input, String output) {
        StreamsBuilder builder = new StreamsBuilder();
        KTable<String, String> totals = builder
                .stream(input, Consumed.with(Serdes.String(), Serdes.String()))
                .groupBy((key, value) -> groupOf(value), Grouped.with("by-group", Serdes.String(), Serdes.String()))
                .aggregate(() -> "0,0", (group, value, total) -> add(total, value),
                        Materialized.<String, String, KeyValueStore<Bytes, byte[]>>as("totals")
                                .withKeySerde(Serdes.String())
                                .withValueSerde(Serdes.String()));
        totals.toStream().to(output, Produced.with(Serdes.String(), Serdes.String()));
        return builder.build();
    }

    static String groupOf(String value) {
        return value.substring(0, value.indexOf(','));
    }

    /** "count,sum" plus the amount of one input record "group,amount". */
    static String add(String total, String value) {
        int comma = total.indexOf(',');
        long count = Long.parseLong(total.substring(0, comma));
        long sum = Long.parseLong(total.substring(comma + 1));
        long amount = Long.parseLong(value.substring(value.indexOf(',') + 1));
        return (count + 1) + "," + (sum + amount);
    }

    static Properties configuration(Map<String, String> args) {
        Properties p = new Properties();
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, required(args, "bootstrap"));
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, required(args, "application-id"));
        p.put(StreamsConfig.STATE_DIR_CONFIG, required(args, "state-dir"));
        p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, args.getOrDefault("commit-interval-ms", "150"));
        p.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, args.getOrDefault("cache-bytes", "0"));
        p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, args.getOrDefault("threads", "1"));
        p.put(StreamsConfig.GROUP_PROTOCOL_CONFIG, "classic");
        int replication = Integer.parseInt(args.getOrDefault("replication", "1"));
        p.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, replication);
        if (replication > 1) {
            p.put(StreamsConfig.topicPrefix("min.insync.replicas"), "2");
        }
        // Generous timeouts: the brokers, this JVM and the test share two cores, and a broker may be killed.
        p.put(StreamsConfig.TASK_TIMEOUT_MS_CONFIG, 300_000L);
        p.put(StreamsConfig.consumerPrefix(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG), 10_000);
        p.put(StreamsConfig.consumerPrefix(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG), 1_000);
        p.put(StreamsConfig.consumerPrefix(ConsumerConfig.MAX_POLL_INTERVAL_MS_CONFIG), 300_000);
        p.put(StreamsConfig.REQUEST_TIMEOUT_MS_CONFIG, 60_000);
        p.put(StreamsConfig.RECONNECT_BACKOFF_MAX_MS_CONFIG, 1_000L);
        p.put(StreamsConfig.producerPrefix(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG), 60_000);
        p.put(StreamsConfig.producerPrefix(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG), 300_000);
        p.put(StreamsConfig.producerPrefix(ProducerConfig.MAX_BLOCK_MS_CONFIG), 120_000L);
        p.put(StreamsConfig.consumerPrefix(ConsumerConfig.DEFAULT_API_TIMEOUT_MS_CONFIG), 120_000);
        return p;
    }

    static String required(Map<String, String> args, String name) {
        String value = args.get(name);
        if (value == null) {
            throw new IllegalArgumentException("missing --" + name);
        }
        return value;
    }

    private static final class RestoreReport implements StateRestoreListener {
        @Override
        public void onRestoreStart(TopicPartition partition, String store, long start, long end) {
            emit("restore_start", "store", store, "topic", partition.topic(),
                    "partition", Integer.toString(partition.partition()),
                    "start_offset", Long.toString(start), "end_offset", Long.toString(end));
        }

        @Override
        public void onBatchRestored(TopicPartition partition, String store, long batchEnd, long restored) {
        }

        @Override
        public void onRestoreEnd(TopicPartition partition, String store, long restored) {
            emit("restore_end", "store", store, "topic", partition.topic(),
                    "partition", Integer.toString(partition.partition()), "restored", Long.toString(restored));
        }
    }

    // -- output: one JSON object a line, every value a string ------------------------------------------------

    static synchronized void emit(String event, String... pairs) {
        StringBuilder line = new StringBuilder("{\"event\":").append(quote(event));
        line.append(",\"ts_ms\":").append(quote(Long.toString(System.currentTimeMillis())));
        for (int i = 0; i + 1 < pairs.length; i += 2) {
            line.append(',').append(quote(pairs[i])).append(':').append(quote(pairs[i + 1]));
        }
        OUT.println(line.append('}'));
    }

    static String describe(Throwable error) {
        StringBuilder text = new StringBuilder();
        for (Throwable t = error; t != null; t = t.getCause()) {
            if (text.length() > 0) {
                text.append(" <- caused by ");
            }
            text.append(t.getClass().getName()).append(": ").append(t.getMessage());
            if (t.getCause() == t) {
                break;
            }
        }
        return text.toString();
    }

    static String stack(Throwable error) {
        StringBuilder text = new StringBuilder();
        StackTraceElement[] frames = error.getStackTrace();
        for (int i = 0; i < Math.min(frames.length, 12); i++) {
            text.append(frames[i]).append('\n');
        }
        return text.toString();
    }

    static String quote(String s) {
        if (s == null) {
            return "null";
        }
        StringBuilder q = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            switch (c) {
                case '"' -> q.append("\\\"");
                case '\\' -> q.append("\\\\");
                case '\n' -> q.append("\\n");
                case '\r' -> q.append("\\r");
                case '\t' -> q.append("\\t");
                default -> {
                    if (c < 0x20) {
                        q.append(String.format("\\u%04x", (int) c));
                    } else {
                        q.append(c);
                    }
                }
            }
        }
        return q.append('"').toString();
    }
}
