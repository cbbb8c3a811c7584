"""Kafka Streams 4.4 with processing.guarantee=exactly_once_v2 on a real oncelog broker (issue 22's proof).

`tests/interop/streams/` is a Maven project with one program, `oncelog.streams.EosAggregation`: one Kafka Streams
instance of an aggregation that re-keys its input by group (a repartition topic, which Kafka Streams purges with
DeleteRecords) and keeps a count and a sum per group in a store with a compacted changelog, every update going to
an output topic (tests/support/streams_app.py drives it). The jar is built once per session (`mvn -q -B package`;
the first build resolves from Maven Central into ~/.m2, later ones work offline). Without `java` or `mvn`, or
when Maven Central cannot be reached for the first build, the tests here are skipped with the reason.

The broker runs its log cleaner hard (segments roll every second, a pass every 200 ms, any dirty share cleaned,
markers and tombstones dropped after a second), so Kafka Streams' restores read cleaned changelogs. Two
instances run while transactional input waves arrive (some transactions aborted on purpose); one instance is
SIGKILLed and restarted with its state directory wiped (a restore from the cleaned changelog), and the broker is
SIGKILLed and restarted, each while input is being produced and processed. At the end the output read with
read_committed must be exactly what exactly-once gives (check_exactly_once: per group the counts 1..N once each,
the sum growing by each committed input id once, nothing from aborted input), both instances RUNNING with no
fatal error, the changelog cleaned, the repartition topic purged, and no traceback in the broker log.

The long run (more waves, more kills, a 3-broker cluster whose partition leaders are SIGKILLed) is
tests/cluster/test_cluster_kafka_streams.py (cluster_slow: `make cluster-test`).
"""

from __future__ import annotations

import time

import pytest
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

PARTITIONS = 4          # input, output, and so the repartition topic and changelog
GROUPS = 12
# The cleaner run hard within what Kafka 4.4 accepts: segments roll by age each second (on the next append, as in
# Kafka; segment.ms's minimum is 1 ms), log.segment.bytes at its minimum since Kafka 4.0 (1 MiB, KIP-1030; the
# changelogs here never fill one, the age rolls them), a pass every 200 ms, any dirty share cleaned, tombstones and
# transaction markers dropped after a second.
CLEANER = {"log.segment.bytes": 1 << 20, "log.roll.ms": 1000, "log.cleaner.backoff.ms": 200,
           "log.cleaner.min.cleanable.ratio": 0.01, "log.cleaner.delete.retention.ms": 1000}
BROKER = {**CLEANER, "offsets.topic.num.partitions": 5, "transaction.state.log.num.partitions": 5,
          "group.initial.rebalance.delay.ms": 0}
# Input and output are plain (cleanup.policy=delete) topics with larger segments; the changelog is what is cleaned.
PLAIN_TOPIC = {"segment.bytes": str(64 << 20)}
# Kafka Streams purges its repartition topics every 30 s by default; every 5 s here so a short run sees it.
STREAMS_CONFIG = {"repartition.purge.interval.ms": 5000}
START_TIMEOUT_S = 180.0
DRAIN_TIMEOUT_S = 240.0


@pytest.fixture(scope="session")
def streams_jar():
    try:
        return build_jar()
    except StreamsUnavailable as exc:
        pytest.skip(str(exc))


def test_the_check_catches_what_exactly_once_forbids():
    """check_exactly_once on made-up outputs: it passes the exact one and names each kind of violation."""
    ids = list(range(1, 41))
    expected = expected_totals(ids, 3)

    def exact():
        return {g: [(n + 1, sum(members[:n + 1])) for n in range(len(members))] for g, members in expected.items()}

    assert check_exactly_once(expected, exact(), 4) == []
    group = sorted(expected)[0]
    members = expected[group]

    duplicate = exact()   # one record processed twice: a count repeats
    duplicate[group].insert(3, duplicate[group][2])
    replayed = exact()    # a store restored to an older value: counts go back
    replayed[group] = replayed[group][:5] + replayed[group][3:]
    lost = exact()        # one record never aggregated
    lost[group] = [(n + 1, sum(members[1:n + 2])) for n in range(len(members) - 1)]
    swapped = exact()     # one record lost and another counted twice: counts look right, the sums do not
    wrong = [members[0], members[0], *members[2:]]
    swapped[group] = [(n + 1, sum(wrong[:n + 1])) for n in range(len(wrong))]
    aborted = exact()     # an aborted input record counted
    aborted[group].append((len(members) + 1, sum(members) + 10_000))
    reordered = exact()   # two records of one input partition aggregated out of order
    same_partition = [i for i in members if i % 4 == members[0] % 4]
    order = [same_partition[1], same_partition[0], *[i for i in members if i not in same_partition[:2]]]
    reordered[group] = [(n + 1, sum(order[:n + 1])) for n in range(len(order))]
    for name, output in [("duplicate", duplicate), ("replayed", replayed), ("lost", lost), ("swapped", swapped),
                         ("aborted", aborted), ("reordered", reordered)]:
        problems = check_exactly_once(expected, output, 4)
        assert problems and all(p.startswith(f"{group}:") for p in problems), (name, problems)


@pytest.mark.timeout(600)
def test_streams_eos_aggregation_through_an_instance_and_a_broker_sigkill(streams_jar, broker_factory, tmp_path):
    broker = broker_factory(BROKER)
    run = EosRun(broker.bootstrap, tmp_path, streams_jar, partitions=PARTITIONS, groups=GROUPS,
                 topic_config=PLAIN_TOPIC, streams_config=STREAMS_CONFIG)
    a, b = run.instances
    try:
        run.start_all(START_TIMEOUT_S)

        # Wave 1 paced over ~6 s (segments roll each second), every 5th transaction aborted; processed in full,
        # then the changelog cleaned by the broker: each committed input record wrote one changelog record in a
        # committed transaction, far fewer are left.
        run.wave(3000, per_transaction=50, pause=0.1, abort_every=5).finish()
        run.drain(DRAIN_TIMEOUT_S)
        processed = len(run.committed())
        wait_until(lambda: run.changelog_records() < processed / 2, timeout=120, interval=1.0,
                   what=f"{run.changelog} cleaned below half of its {processed} records")

        # Wave 2 paced over ~6 s; instance a SIGKILLed in the middle, its state wiped, restarted: some store
        # is restored from a cleaned changelog (far fewer records than offsets).
        w2 = run.wave(3000, per_transaction=50, pause=0.1)
        wait_until(lambda: w2.progress() >= 600, timeout=120, interval=0.1, what="wave 2 under way")
        a.kill()
        a.wipe_state()
        marks = run.marks()
        a.start()
        w2.finish()
        a.wait_state("RUNNING", START_TIMEOUT_S, since=marks["a"])
        run.drain(DRAIN_TIMEOUT_S)
        restores = run.restores_since(marks)
        assert read_cleaned(restores), f"no restore read a cleaned changelog: {restores}\n{run.describe()}"

        # Wave 3 paced; the broker SIGKILLed in the middle and restarted on its port and data.
        w3 = run.wave(3000, per_transaction=50, pause=0.1)
        wait_until(lambda: w3.progress() >= 600, timeout=120, interval=0.1, what="wave 3 under way")
        before_kill = w3.progress()
        broker.kill()
        time.sleep(1.0)
        broker.start()
        w3.finish()
        assert w3.progress() > before_kill, "wave 3 ended before the broker was killed"
        run.drain(DRAIN_TIMEOUT_S)
        for inst in run.instances:
            inst.wait_state("RUNNING", START_TIMEOUT_S)
            assert not inst.fatal(), f"{inst.name} reported a fatal error:\n{inst.describe()}"
        run.stop_all()   # SIGTERM: each closes cleanly (commits, writes its checkpoints)
    finally:
        run.kill_all()

    # Exactly once: per group every committed input id aggregated once, in order, nothing aborted.
    ids, aborted = run.committed(), run.aborted()
    assert aborted and len(ids) + len(aborted) == 9000
    output = read_output(broker.bootstrap, run.sink, PARTITIONS)
    problems = check_exactly_once(expected_totals(ids, GROUPS), output, PARTITIONS)
    assert not problems, "\n".join(problems[:20]) + f"\n{events_summary(run.instances)}"

    # The broker side: the changelog cleaned (fewer records than updates), the repartition topic purged by
    # Kafka Streams' DeleteRecords, no traceback in the broker's log.
    left = records_from_start(broker.bootstrap, run.changelog, PARTITIONS)
    assert sum(left.values()) < len(ids) / 2, (left, len(ids))
    purged = offsets(broker.bootstrap, run.repartition, PARTITIONS)
    assert all(start > 0 for start, _end in purged.values()), purged
    assert not tracebacks(broker.log_path), tracebacks(broker.log_path)[:5]
    print(f"\n[streams eos] {len(ids)} committed input records, {len(aborted)} aborted, changelog records from "
          f"the start {left}, repartition (start, end) {purged}\n{events_summary(run.instances)}")
