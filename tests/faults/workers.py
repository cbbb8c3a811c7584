"""Workload processes of the fault harness; each records its operations in its own history file.

Run as `python -m tests.faults.workers KIND --bootstrap ... --history DIR --name NAME ...`. Workers are separate
processes so the nemesis can SIGKILL a client, and they stop by themselves after `--seconds`.
Kinds: producer (idempotent), txn-producer (random aborts and stalls past the transaction timeout), reader
(read_committed or read_uncommitted, from the beginning), deleter (DeleteRecords churn), lso-monitor, copier
(consume-transform-produce exactly once), spark-copy (the Spark exactly-once pipeline), group-consumer (a member
of a consumer group that commits what it read). `--client` picks confluent-kafka (librdkafka) or oncelog's own client.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tests.faults.history import HistoryWriter

FATAL_PAUSE_S = 0.5
HANG_EXIT = 3  # exit code of a worker whose watchdog saw no progress: the runner restarts it
HANG_AFTER_S = 75.0  # longer than any client call's own timeout (30 s) plus its retries
DRAIN_MAX_S = 150.0  # a copier stops this long after its deadline even if its input is not all copied


class Watchdog:
    """Kills the worker when its loop stops making progress.

    librdkafka's send_offsets_to_transaction() can block forever, past its own timeout, when every connection
    drops at once (it re-bootstraps and its cached group coordinator is decommissioned: librdkafka issues
    5456 and 5511). An application would restart such a process; so does the harness, and it counts it.
    """

    def __init__(self) -> None:
        self.last = time.monotonic()
        threading.Thread(target=self._watch, daemon=True, name="watchdog").start()

    def tick(self) -> None:
        self.last = time.monotonic()

    def _watch(self) -> None:
        while True:
            time.sleep(1)
            if time.monotonic() - self.last > HANG_AFTER_S:
                faulthandler.dump_traceback(all_threads=True)
                sys.stderr.write(f"worker made no progress for {HANG_AFTER_S:.0f} s: exiting to be restarted\n")
                sys.stderr.flush()
                os._exit(HANG_EXIT)


# Settings every client of this worker adds (`--client-config`, a JSON object): a secured cluster's
# security.protocol, ssl.ca.location and SASL credentials (tests/faults/secure.py); empty otherwise.
CLIENT_CONFIG: dict[str, str] = {}


def _base(bootstrap: str) -> dict[str, str]:
    """The start of every client's configuration: where to bootstrap and how to authenticate."""
    return {"bootstrap.servers": bootstrap, **CLIENT_CONFIG}


def _confluent():
    import confluent_kafka
    import confluent_kafka.admin

    return confluent_kafka, confluent_kafka.admin


def _client_modules(name: str):
    """(Producer, Consumer, TopicPartition) of the chosen client; both follow confluent-kafka's API."""
    if name == "oncelog":
        from oncelog.client import Consumer, Producer, TopicPartition

        return Producer, Consumer, TopicPartition
    ck, _ = _confluent()
    return ck.Producer, ck.Consumer, ck.TopicPartition


def _offset(msg: Any) -> int:
    """A delivered message's offset, -1 when the broker acknowledged it as a duplicate without one (46)."""
    offset = msg.offset()
    return -1 if offset is None else offset


def _debug(args: argparse.Namespace) -> dict[str, str]:
    """librdkafka's own trace (FAULTS_DEBUG=eos,msg,...), for chasing a hang or an anomaly to its cause."""
    if os.environ.get("FAULTS_DEBUG") and args.client == "confluent":
        return {"debug": os.environ["FAULTS_DEBUG"]}
    return {}


class AckedOffsets:
    """The offset of each acknowledged message, as the history records it.

    librdkafka numbers the messages of a batch acknowledged without an offset (DUPLICATE_SEQUENCE_NUMBER: the
    broker no longer caches that batch, so it cannot say where it is; KAFKA-12207) from the answer's -1 on: -1,
    0, 1, ... Those are no offsets. A batch's reports come in a row, so per partition the run -1, 0, 1, ... after
    a -1 is that batch's (a real offset after it is at least the batch's length, never the next in that run);
    such messages are recorded with offset -1 and the number reported."""

    def __init__(self) -> None:
        self._run: dict[int, int] = {}

    def fields(self, partition: int, msg: Any) -> dict[str, int]:
        offset = _offset(msg)
        if offset == -1:
            self._run[partition] = 0
        elif self._run.get(partition) == offset:
            self._run[partition] = offset + 1
            return {"offset": -1, "reported": offset}
        else:
            self._run.pop(partition, None)
        return {"offset": offset}


def producer(args: argparse.Namespace, h: HistoryWriter) -> None:
    """Idempotent producer: unique values round-robin over partitions, acks=all, a bounded rate."""
    Producer, _, _ = _client_modules(args.client)
    p = Producer({**_base(args.bootstrap), "enable.idempotence": True, "acks": "all",
                  "linger.ms": 5, "delivery.timeout.ms": 120_000, "request.timeout.ms": 5_000,
                  "max.in.flight.requests.per.connection": 5,
                  **_debug(args)})
    deadline = time.monotonic() + args.seconds
    n = 0
    acked = AckedOffsets()

    def report(err: Any, msg: Any, value: str, partition: int, seq: int) -> None:
        if err is None:
            h.log("send", phase="ok", v=value, p=partition, seq=seq, **acked.fields(partition, msg))
        else:
            h.log("send", phase="fail", v=value, p=partition, seq=seq, error=str(err))

    while time.monotonic() < deadline:
        partition = n % args.partitions
        value = f"{args.name}:{n}"
        h.log("send", phase="invoke", v=value, p=partition, seq=n)
        while True:
            try:
                p.produce(args.topic, value.encode(), partition=partition,
                          on_delivery=lambda e, m, v=value, pt=partition, s=n: report(e, m, v, pt, s))
                break
            except BufferError:
                p.poll(0.05)
        n += 1
        p.poll(0)
        time.sleep(1.0 / args.rate)
    p.flush(150)


def txn_producer(args: argparse.Namespace, h: HistoryWriter) -> None:
    """Transactions of a few records; about a third aborted, some stalled past the transaction timeout."""
    Producer, _, _ = _client_modules(args.client)
    rng = random.Random(args.seed)
    conf = {**_base(args.bootstrap), "transactional.id": f"fault-{args.name}",
            "transaction.timeout.ms": args.txn_timeout_ms, "linger.ms": 5, "request.timeout.ms": 5_000}
    p = Producer(conf)
    p.init_transactions(60)
    deadline = time.monotonic() + args.seconds
    n = t = 0
    acked = AckedOffsets()
    dog = Watchdog()
    while time.monotonic() < deadline:
        dog.tick()
        txn = f"{args.name}-t{t}"
        t += 1
        try:
            p.begin_transaction()
            h.log("txn", phase="begin", txn=txn)
            for _ in range(rng.randint(1, 6)):
                partition = rng.randrange(args.partitions)
                value = f"{args.name}:{n}"
                h.log("send", phase="invoke", v=value, p=partition, seq=n, txn=txn)
                p.produce(args.topic, value.encode(), partition=partition,
                          on_delivery=lambda e, m, v=value, pt=partition, s=n, x=txn: h.log(
                              "send", phase="ok" if e is None else "fail", v=v, p=pt, seq=s, txn=x,
                              **(acked.fields(pt, m) if e is None else {"error": str(e)})))
                n += 1
                p.poll(0)
            if rng.random() < 0.05:
                time.sleep(args.txn_timeout_ms / 1000 * 1.5)  # the broker's reaper aborts this one
            if rng.random() < 0.33:
                h.log("txn", phase="abort-invoke", txn=txn)
                p.abort_transaction(30)
                h.log("txn", phase="abort-ok", txn=txn)
            else:
                h.log("txn", phase="commit-invoke", txn=txn)
                p.commit_transaction(30)
                h.log("txn", phase="commit-ok", txn=txn)
        except Exception as exc:  # noqa: BLE001 - every failure is recorded, then the producer recovers
            h.log("txn", phase="commit-fail", txn=txn, error=repr(exc))
            p = _recover(p, conf, h, txn, Producer)
        time.sleep(rng.random() * 0.05)
    p.flush(30)


def _recover(p: Any, conf: dict, h: HistoryWriter, txn: str, Producer: Any) -> Any:
    """Abort if the producer can; otherwise (fatal) build a new one, whose init fences and aborts the old txn."""
    try:
        h.log("txn", phase="abort-invoke", txn=txn)
        p.abort_transaction(30)
        h.log("txn", phase="abort-ok", txn=txn)
        return p
    except Exception as exc:  # noqa: BLE001
        h.log("txn", phase="abort-fail", txn=txn, error=repr(exc))
    for _ in range(30):
        try:
            fresh = Producer(conf)
            fresh.init_transactions(30)
            return fresh
        except Exception:  # noqa: BLE001 - the broker may be down for a while
            time.sleep(FATAL_PAUSE_S)
    raise RuntimeError("producer could not recover")


def reader(args: argparse.Namespace, h: HistoryWriter) -> None:
    """Reads every partition from the beginning until the deadline; a consumer error starts a new session."""
    _, Consumer, TopicPartition = _client_modules(args.client)
    iso = "read_committed" if args.isolation == "rc" else "read_uncommitted"
    deadline = time.monotonic() + args.seconds
    session = 0
    positions = {p: 0 for p in range(args.partitions)}
    while time.monotonic() < deadline:
        c = Consumer({**_base(args.bootstrap), "group.id": f"fault-{args.name}",
                      "enable.auto.commit": False, "isolation.level": iso, "auto.offset.reset": "earliest",
                      "session.timeout.ms": 10_000})
        c.assign([TopicPartition(args.topic, p, positions[p]) for p in range(args.partitions)])
        try:
            while time.monotonic() < deadline:
                for msg in c.consume(500, 0.5):
                    if msg.error():
                        continue
                    h.log("read", iso=args.isolation, session=session, p=msg.partition(), offset=msg.offset(),
                          v=msg.value().decode())
                    positions[msg.partition()] = msg.offset() + 1
        except Exception as exc:  # noqa: BLE001
            h.log("info", error=repr(exc))
        finally:
            c.close()
        session += 1


def _admin(bootstrap: str) -> Any:
    _, admin = _confluent()
    return admin.AdminClient({**_base(bootstrap), "socket.timeout.ms": 5_000})


def deleter(args: argparse.Namespace, h: HistoryWriter) -> None:
    """DeleteRecords up to the high watermark of a random partition, every `--interval` seconds."""
    ck, admin_mod = _confluent()
    rng = random.Random(args.seed)
    admin = _admin(args.bootstrap)
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        time.sleep(args.interval)
        partition = rng.randrange(args.partitions)
        tp = ck.TopicPartition(args.topic, partition)
        try:
            high = admin.list_offsets({tp: admin_mod.OffsetSpec.latest()},
                                      isolation_level=ck.IsolationLevel.READ_UNCOMMITTED)[tp].result(10).offset
            tp.offset = high
            done = admin.delete_records([tp])[tp].result(10)
            h.log("delete", p=partition, before=done.low_watermark)
        except Exception as exc:  # noqa: BLE001
            h.log("info", error=repr(exc))


def lso_monitor(args: argparse.Namespace, h: HistoryWriter) -> None:
    """Samples each partition's last stable offset and high watermark."""
    ck, admin_mod = _confluent()
    admin = _admin(args.bootstrap)
    deadline = time.monotonic() + args.seconds
    tps = [ck.TopicPartition(args.topic, p) for p in range(args.partitions)]
    while time.monotonic() < deadline:
        try:
            latest = admin_mod.OffsetSpec.latest()
            lso = admin.list_offsets({tp: latest for tp in tps}, isolation_level=ck.IsolationLevel.READ_COMMITTED)
            hwm = admin.list_offsets({tp: latest for tp in tps}, isolation_level=ck.IsolationLevel.READ_UNCOMMITTED)
            for tp in tps:
                h.log("lso", p=tp.partition, lso=lso[tp].result(10).offset, hwm=hwm[tp].result(10).offset)
        except Exception as exc:  # noqa: BLE001
            h.log("info", error=repr(exc))
        time.sleep(args.interval)


def copier(args: argparse.Namespace, h: HistoryWriter) -> None:
    """Exactly-once copy: read_committed from --in-topic, write `copy:<value>` to --topic, offsets in the txn.

    Each record goes to the output partition of the same number as its input partition, in the order read, so
    per-partition order carries over. One transaction per poll of at most --batch records (smaller batches mean
    more transactions per record copied: tests/cluster/test_transactions_copier.py uses that to keep a short copy
    running through its bounces)."""
    Producer, Consumer, TopicPartition = _client_modules(args.client)
    conf = {**_base(args.bootstrap), "transactional.id": f"fault-copier-{args.slot}",
            "transaction.timeout.ms": args.txn_timeout_ms, "linger.ms": 5, "request.timeout.ms": 5_000}
    conf.update(_debug(args))
    c = Consumer({**_base(args.bootstrap), "group.id": args.group, "enable.auto.commit": False,
                  "isolation.level": "read_committed", "auto.offset.reset": "earliest",
                  "session.timeout.ms": 10_000, **_debug(args)})
    c.subscribe([args.in_topic])
    p = Producer(conf)
    p.init_transactions(60)
    deadline = time.monotonic() + args.seconds
    t = 0
    seq = 0
    # After the deadline the copier drains what its source acknowledged: it stops once the group's committed
    # offsets reach the input's end (checked after 2 s without input), or --drain-max-s after the deadline.
    idle_since = time.monotonic()
    in_partitions = [TopicPartition(args.in_topic, part) for part in range(args.partitions)]

    def draining() -> bool:
        now = time.monotonic()
        if now > deadline + args.drain_max_s:
            return False
        return now - idle_since < 2 or not _copied_everything(c, in_partitions)

    # A clean stop (SIGTERM, Kafka's clean bounce of a copier): the transaction under way commits (or is
    # recovered), then the consumer leaves its group and the process exits 0.
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    dog = Watchdog()
    while not stopping and (time.monotonic() < deadline or draining()):
        dog.tick()
        msgs = [m for m in c.consume(args.batch, 0.5) if not m.error()]
        if not msgs:
            continue
        idle_since = time.monotonic()
        txn = f"{args.name}-t{t}"
        t += 1
        try:
            p.begin_transaction()
            h.log("txn", phase="begin", txn=txn)
            for m in msgs:
                value = "copy:" + m.value().decode()
                h.log("send", phase="invoke", v=value, p=m.partition(), seq=seq, txn=txn)
                p.produce(args.topic, value.encode(), partition=m.partition())
                seq += 1
            ends: dict[int, int] = {}
            for m in msgs:
                ends[m.partition()] = m.offset() + 1
            offsets = [TopicPartition(args.in_topic, part, off) for part, off in ends.items()]
            p.send_offsets_to_transaction(offsets, c.consumer_group_metadata(), 30)
            h.log("txn", phase="commit-invoke", txn=txn)
            p.commit_transaction(30)
            h.log("txn", phase="commit-ok", txn=txn)
        except Exception as exc:  # noqa: BLE001
            h.log("txn", phase="commit-fail", txn=txn, error=repr(exc))
            p = _recover(p, conf, h, txn, Producer)
            _rewind(c, TopicPartition)
        # Draining ends after 5 s without input while polling, not while a call blocked through a fault.
        idle_since = time.monotonic()
    if stopping:
        h.log("info", stopped="SIGTERM")
    c.close()


GROUP_SESSION_TIMEOUT_MS = 6_000  # a SIGKILLed member's partitions move on within a run
GROUP_IDLE_S = 5.0  # after its deadline a member stops once the group committed everything and this long passed


def group_consumer(args: argparse.Namespace, h: HistoryWriter) -> None:
    """A member of consumer group --group on --topic: logs every record it reads, then commits (synchronously)
    the offsets after what it read; at-least-once. Each assignment starts a new read session (`assign` event with
    its partitions), so a restart from the committed offsets is no non-monotonic poll, and the checker can compare
    where a session starts with the commits acknowledged before it (a lost commit). Only what was logged as read
    is ever committed, so every offset below the group's final committed offset must have been read by some
    member. After the deadline it drains until the producers are done (`--done-file` exists, written by the
    runner) and the group's committed offsets reach every partition's end (checked after GROUP_IDLE_S without
    input), or DRAIN_MAX_S passed."""
    _, Consumer, TopicPartition = _client_modules(args.client)
    session = {"n": 0, "id": f"{args.name}/0"}

    def on_assign(consumer: Any, partitions: list[Any]) -> None:
        session["n"] += 1
        session["id"] = f"{args.name}/{session['n']}"
        h.log("assign", group=args.group, session=session["id"], partitions=sorted(tp.partition for tp in partitions))

    def on_revoke(consumer: Any, partitions: list[Any]) -> None:
        h.log("revoke", group=args.group, session=session["id"], partitions=sorted(tp.partition for tp in partitions))

    c = Consumer({**_base(args.bootstrap), "group.id": args.group, "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "isolation.level": "read_committed",
                  "session.timeout.ms": GROUP_SESSION_TIMEOUT_MS, "heartbeat.interval.ms": 1_000, **_debug(args)})
    c.subscribe([args.topic], on_assign=on_assign, on_revoke=on_revoke)
    deadline = time.monotonic() + args.seconds
    idle_since = time.monotonic()
    partitions = [TopicPartition(args.topic, part) for part in range(args.partitions)]

    done_file = Path(args.done_file) if args.done_file else None

    def draining() -> bool:
        now = time.monotonic()
        if now > deadline + DRAIN_MAX_S:
            return False
        if done_file is not None and not done_file.exists():
            return True
        return now - idle_since < GROUP_IDLE_S or not _copied_everything(c, partitions)

    dog = Watchdog()
    while time.monotonic() < deadline or draining():
        dog.tick()
        try:
            msgs = c.consume(50, 0.5)
        except Exception as exc:  # noqa: BLE001 - recorded; the consumer goes on
            h.log("info", error=repr(exc))
            continue
        ends: dict[int, int] = {}
        for m in msgs:
            if m.error():
                continue
            h.log("read", iso="rc", group=args.group, session=session["id"], p=m.partition(), offset=m.offset(),
                  v=m.value().decode())
            ends[m.partition()] = m.offset() + 1
        if not ends:
            continue
        idle_since = time.monotonic()
        pairs = sorted(ends.items())
        h.log("commit", phase="invoke", group=args.group, session=session["id"], offsets=pairs)
        try:
            done = c.commit(offsets=[TopicPartition(args.topic, part, off) for part, off in pairs], asynchronous=False)
        except Exception as exc:  # noqa: BLE001 - a rebalance or a moving coordinator: the next commit covers it
            h.log("commit", phase="fail", group=args.group, session=session["id"], offsets=pairs, error=repr(exc))
            continue
        failed = {tp.partition for tp in done or [] if getattr(tp, "error", None) is not None}
        acked = [(part, off) for part, off in pairs if part not in failed]
        if acked:
            h.log("commit", phase="ok", group=args.group, session=session["id"], offsets=acked)
        if failed:
            h.log("commit", phase="fail", group=args.group, session=session["id"],
                  offsets=[(part, off) for part, off in pairs if part in failed], error="partition errors")
    c.close()


def _copied_everything(c: Any, partitions: list[Any]) -> bool:
    """Whether the group's committed offsets are at the end of every input partition."""
    try:
        committed = c.committed(partitions, 10)
        return all(tp.offset >= c.get_watermark_offsets(tp, 10, cached=False)[1] for tp in committed)
    except Exception:  # noqa: BLE001 - the broker may be down: not known, so not done
        return False


def _rewind(c: Any, TopicPartition: Any) -> None:
    """Read again, from the group's committed offsets, whatever the failed transaction did not commit."""
    for attempt in range(30):
        try:
            for tp in c.assignment():
                committed = c.committed([tp], 30)[0]
                c.seek(TopicPartition(tp.topic, tp.partition, max(committed.offset, 0)))
            return
        except Exception:  # noqa: BLE001 - the broker may be down or the assignment moving: try again
            time.sleep(FATAL_PAUSE_S * (attempt + 1))
    raise RuntimeError("copier could not rewind to the committed offsets")


SPARK_DRAIN_IDLE_S = 8.0  # after its deadline the pipeline stops once a drain pass has read nothing this long


def spark_copy(args: argparse.Namespace, h: HistoryWriter) -> None:
    """The Spark exactly-once pipeline: oncelog source (--in-topic) -> `copy:<value>` -> oncelog exactly-once
    sink (--topic), a streaming query on local[2] with a short processing-time trigger, checkpointed next to the
    histories so a SIGKILLed driver (its JVM dies with it) restarts where the last committed batch ended.

    A query that fails (a broker killed or paused longer than a transaction) is started again from the
    checkpoint, as an application would. After the deadline, Trigger.AvailableNow passes drain the input until
    one has read nothing for SPARK_DRAIN_IDLE_S. The sink's writes are not in the history: the checker expects
    `copy:` + every acknowledged input value in the output, exactly once.
    """
    from pyspark.errors import StreamingQueryException
    from pyspark.sql.functions import concat, lit

    from oncelog.spark import register
    from tests.spark.session import start_session, stop_session

    run_dir = Path(args.history).parent
    spark = start_session(run_dir / f"spark-{args.name}", conf={"spark.sql.execution.arrow.maxRecordsPerBatch": "500"})
    register(spark)
    deadline = time.monotonic() + args.seconds

    def start(**trigger: Any) -> Any:
        src = (spark.readStream.format("oncelog").option("kafka.bootstrap.servers", args.bootstrap)
               .option("subscribe", args.in_topic).option("startingOffsets", "earliest")
               .option("maxOffsetsPerTrigger", "3000").load())
        out = src.select("key", concat(lit(bytearray(b"copy:")), src.value).alias("value"))
        return (out.writeStream.format("oncelog").option("kafka.bootstrap.servers", args.bootstrap)
                .option("topic", args.topic).option("transaction.timeout.ms", str(args.txn_timeout_ms))
                .option("checkpointLocation", str(run_dir / "spark-checkpoint")).trigger(**trigger).start())

    def finished(query: Any) -> int | None:
        """Rows the query read if it ended well; None (recorded) if it failed."""
        failure = query.exception()
        if failure is not None:
            h.log("info", error=f"query failed, restarting from the checkpoint: {failure}"[:2000])
            return None
        return sum(p["numInputRows"] for p in query.recentProgress)

    logged = -1

    def log_batches(query: Any) -> None:
        """A `batch` event per micro-batch the query finished: the runner SIGKILLs the driver only once its
        current incarnation has run one (a kill during JVM start-up tests nothing)."""
        nonlocal logged
        for progress in query.recentProgress:
            if progress["batchId"] > logged:
                logged = progress["batchId"]
                h.log("batch", id=logged, rows=progress["numInputRows"])

    def wait(query: Any, timeout: float | None) -> None:
        """awaitTermination, which raises the query's failure when the query fails during the wait: the failure
        is read again (and recorded) by finished(); letting it escape ended the worker, and with it the copy."""
        try:
            query.awaitTermination(timeout) if timeout is not None else query.awaitTermination()
        except StreamingQueryException:
            pass
        log_batches(query)

    while time.monotonic() < deadline:
        query = start(processingTime="1 second")
        while time.monotonic() < deadline and query.isActive:
            wait(query, 1)
        if query.isActive:
            query.stop()
        finished(query)
    idle_since = time.monotonic()
    while time.monotonic() - idle_since < SPARK_DRAIN_IDLE_S and time.monotonic() < deadline + DRAIN_MAX_S:
        query = start(availableNow=True)
        wait(query, None)
        rows = finished(query)
        if rows:
            idle_since = time.monotonic()
        elif rows is None:
            time.sleep(FATAL_PAUSE_S)
    stop_session(spark)


KINDS = {"producer": producer, "txn-producer": txn_producer, "reader": reader, "deleter": deleter,
         "lso-monitor": lso_monitor, "copier": copier, "spark-copy": spark_copy, "group-consumer": group_consumer}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("kind", choices=sorted(KINDS))
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--history", required=True, help="directory of history files")
    parser.add_argument("--name", required=True)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--client", choices=("confluent", "oncelog"), default="confluent")
    parser.add_argument("--rate", type=float, default=300, help="records/s of a producer")
    parser.add_argument("--isolation", choices=("rc", "ru"), default="rc")
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--txn-timeout-ms", type=int, default=10_000)
    parser.add_argument("--in-topic")
    parser.add_argument("--group", default="fault-copy")
    parser.add_argument("--slot", type=int, default=0)
    parser.add_argument("--batch", type=int, default=200, help="copier: records per transaction, at most")
    parser.add_argument("--drain-max-s", type=float, default=DRAIN_MAX_S,
                        help="copier: stop this long after --seconds even if the input is not all copied")
    parser.add_argument("--done-file", help="group-consumer: drains until this file exists (producers done)")
    parser.add_argument("--client-config", help="a JSON object of settings every client adds (security)")
    args = parser.parse_args(argv)
    if args.client_config:
        CLIENT_CONFIG.update(json.loads(Path(args.client_config).read_text()))
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the runner asks a stuck worker where it is
    h = HistoryWriter(Path(args.history) / f"{args.name}.jsonl", args.name)
    try:
        KINDS[args.kind](args, h)
    finally:
        h.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
