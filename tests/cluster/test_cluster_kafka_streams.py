"""The long Kafka Streams exactly_once_v2 run (issue 22's proof) on a 3-broker oncelog cluster; cluster_slow.

The program and the checks are tests/interop/test_kafka_streams.py's (tests/support/streams_app.py): an
aggregation with a repartition topic and a compacted changelog, two instances, transactional input waves with
aborted transactions, the cleaner run hard on every broker. Here everything is replicated (input, output and
Kafka Streams' internal topics at replication factor 3, min.insync.replicas 2) and six paced waves each carry a
fault while they are produced and processed: none; instance a SIGKILLed with its state wiped (a restore from a
cleaned changelog); the leader of a changelog partition SIGKILLed, restarted after its leaderships moved;
instance b SIGKILLed with its state kept; the leader of an output partition SIGKILLed; both instances SIGKILLed
at once, a wiped. The output read with read_committed must then be exactly what exactly-once gives, the
instances RUNNING without a fatal error, the changelog cleaned, the repartition topic purged, and no broker log
with a traceback.
"""

from __future__ import annotations

import time

import pytest

from tests.cluster.cluster_processes import converge_s, partitions, wait_for
from tests.integration.helpers import wait_until
from tests.support.streams_app import (
    EosRun,
    StreamsUnavailable,
    build_jar,
    check_exactly_once,
    events_summary,
    expected_totals,
    offsets,
    read_cleaned,
    read_output,
    records_from_start,
    tracebacks,
)

pytestmark = pytest.mark.cluster_slow

PARTITIONS = 4
GROUPS = 12
WAVE = 3000
CLEANER = {"log.segment.bytes": 1 << 20, "log.roll.ms": 1000, "log.cleaner.backoff.ms": 200,
           "log.cleaner.min.cleanable.ratio": 0.01, "log.cleaner.delete.retention.ms": 1000}
BROKER = {**CLEANER, "offsets.topic.num.partitions": 5, "transaction.state.log.num.partitions": 5,
          "group.initial.rebalance.delay.ms": 0}
TOPIC = {"segment.bytes": str(64 << 20), "min.insync.replicas": "2"}
STREAMS_CONFIG = {"repartition.purge.interval.ms": 5000}
START_TIMEOUT_S = 240.0
DRAIN_TIMEOUT_S = 300.0


@pytest.fixture(scope="module")
def streams_jar():
    try:
        return build_jar()
    except StreamsUnavailable as exc:
        pytest.skip(str(exc))


@pytest.mark.timeout(1500)
def test_streams_eos_on_a_cluster_through_leader_and_instance_sigkills(streams_jar, cluster_factory, tmp_path):
    c = cluster_factory(**{k: str(v) for k, v in BROKER.items()})
    run = EosRun(c.bootstrap, tmp_path, streams_jar, partitions=PARTITIONS, groups=GROUPS, topic_config=TOPIC,
                 streams_config=STREAMS_CONFIG, replication=3)
    a, b = run.instances
    killed: list[tuple[str, int]] = []

    def under_way(wave) -> None:
        wait_until(lambda: wave.progress() >= WAVE // 5, timeout=120, interval=0.1, what="the wave under way")

    def kill_leader(wave, topic: str, partition: int) -> None:
        """SIGKILL the broker leading topic-partition while `wave` is produced, wait until another one leads it,
        start it again; the wave goes on after the kill."""
        before = wave.progress()
        leader = partitions(c, topic)[partition].leader_id
        c.kill(leader)
        killed.append((f"{topic}-{partition}", leader))
        via = next(n for n in c.alive())
        wait_for(lambda: partitions(c, topic, via)[partition].leader_id not in (leader, -1),
                 f"a new leader of {topic}-{partition}", converge_s(c.session_timeout_ms))
        c.start_broker(leader, converge_s(c.session_timeout_ms))
        wave.finish()
        assert wave.progress() > before, f"the wave ended before the leader of {topic}-{partition} was killed"

    def expect_running() -> None:
        for inst in run.instances:
            inst.wait_state("RUNNING", START_TIMEOUT_S)
            assert not inst.fatal(), f"{inst.name} reported a fatal error:\n{inst.describe()}"

    try:
        run.start_all(START_TIMEOUT_S)

        # 1: no fault; then every replica's changelog cleaned far below what was written.
        run.wave(WAVE, per_transaction=50, pause=0.1, abort_every=5).finish()
        run.drain(DRAIN_TIMEOUT_S)
        processed = len(run.committed())
        wait_until(lambda: run.changelog_records() < processed / 2, timeout=180, interval=1.0,
                   what=f"{run.changelog} cleaned below half of its {processed} records")

        # 2: instance a SIGKILLed, its state wiped, restarted: a restore from a cleaned changelog.
        w = run.wave(WAVE, per_transaction=50, pause=0.1, abort_every=7)
        under_way(w)
        a.kill()
        a.wipe_state()
        marks = run.marks()
        a.start()
        w.finish()
        run.drain(DRAIN_TIMEOUT_S)
        expect_running()
        restores = run.restores_since(marks)
        assert read_cleaned(restores), f"no restore read a cleaned changelog: {restores}\n{run.describe()}"

        # 3: the leader of changelog partition 0 SIGKILLed.
        w = run.wave(WAVE, per_transaction=50, pause=0.1)
        under_way(w)
        kill_leader(w, run.changelog, 0)
        run.drain(DRAIN_TIMEOUT_S)
        expect_running()

        # 4: instance b SIGKILLed, its state kept, restarted.
        w = run.wave(WAVE, per_transaction=50, pause=0.1, abort_every=7)
        under_way(w)
        b.kill()
        b.start()
        w.finish()
        run.drain(DRAIN_TIMEOUT_S)
        expect_running()

        # 5: the leader of output partition 1 SIGKILLed.
        w = run.wave(WAVE, per_transaction=50, pause=0.1)
        under_way(w)
        kill_leader(w, run.sink, 1)
        run.drain(DRAIN_TIMEOUT_S)
        expect_running()

        # 6: both instances SIGKILLed at once, a's state wiped; both restarted.
        w = run.wave(WAVE, per_transaction=50, pause=0.1)
        under_way(w)
        a.kill()
        b.kill()
        a.wipe_state()
        time.sleep(1.0)
        a.start()
        b.start()
        w.finish()
        run.drain(DRAIN_TIMEOUT_S)
        expect_running()
        run.stop_all()
    finally:
        run.kill_all()

    ids, aborted = run.committed(), run.aborted()
    assert aborted and len(ids) + len(aborted) == 6 * WAVE
    output = read_output(c.bootstrap, run.sink, PARTITIONS)
    problems = check_exactly_once(expected_totals(ids, GROUPS), output, PARTITIONS)
    assert not problems, "\n".join(problems[:20]) + f"\n{events_summary(run.instances)}"

    left = records_from_start(c.bootstrap, run.changelog, PARTITIONS)
    assert sum(left.values()) < len(ids) / 2, (left, len(ids))
    purged = offsets(c.bootstrap, run.repartition, PARTITIONS)
    assert all(start > 0 for start, _end in purged.values()), purged
    for node, broker in c.brokers.items():
        assert not tracebacks(broker.log_path), (node, tracebacks(broker.log_path)[:5])
    print(f"\n[streams eos cluster] {len(ids)} committed input records, {len(aborted)} aborted, leaders killed "
          f"{killed}, changelog records from the start {left}, repartition (start, end) {purged}\n"
          f"{events_summary(run.instances)}")
