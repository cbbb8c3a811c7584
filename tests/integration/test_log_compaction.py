"""Log compaction on a real single-node broker (issue 22, docs/log-cleaner.md): keyed updates across many segments
read back by librdkafka and kafka-python after the cleaner ran, tombstones and their delete horizon, aborted
transactions under read_committed, an idempotent producer writing through cleans, and a SIGKILL at each step of
the swap (the broker kills itself there: `oncelog.test.crash.at`) recovered to a log that loses nothing."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer
from tests.integration.helpers import (
    Out,
    ck_consume,
    ck_produce,
    create_topic,
    fetch_raw,
    kp_consume,
    wait_until,
)
from tests.integration.test_idempotence_rules import producers_of
from tests.support.wire import Wire

from oncelog.records.batch import read_header

KEYS = 60
UPDATES = 10
CLEANER = {"log.cleaner.backoff.ms": 100}
COMPACTED = {"cleanup.policy": "compact", "segment.bytes": "8192", "min.cleanable.dirty.ratio": "0.01"}
SMALL_BATCHES = {"batch.size": 2048}  # librdkafka's batches fit the small segments
PAD = b"." * 60


def produce_updates(bootstrap: str, topic: str, updates: int = UPDATES, tag: str = "v") -> dict[bytes, tuple[int, bytes]]:
    """KEYS keys, `updates` rounds each; {key: (offset, value) of its latest write}."""
    outs = [Out(0, b"key-%03d" % k, b"%s-%d-%03d%s" % (tag.encode(), r, k, PAD))
            for r in range(updates) for k in range(KEYS)]
    offsets = ck_produce(bootstrap, topic, outs, **SMALL_BATCHES)
    latest = {}
    for out, (_p, offset) in zip(outs, offsets, strict=True):
        latest[out.key] = (offset, out.value)
    return latest


def cleaned_to(broker, topic: str, records_at_most: int, timeout: float = 60.0) -> list:
    """Read the whole partition until the cleaner has brought it to at most `records_at_most` records."""
    def small():
        recs = ck_consume(broker.bootstrap, topic, {0: 0})
        return recs if len(recs) <= records_at_most else None
    return wait_until(small, timeout=timeout, interval=0.5, what=f"{topic} cleaned to {records_at_most} records")


def cleaner_workers(pid: int) -> list[int]:
    """The broker's cleaner worker processes (spawned children running multiprocessing's entry point)."""
    found = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in children:
            try:
                if b"multiprocessing.spawn" in Path(f"/proc/{child}/cmdline").read_bytes():
                    found.append(int(child))
            except OSError:
                continue
    return found


def latest_of(recs) -> dict[bytes, tuple[int, bytes]]:
    out = {}
    for r in recs:
        out[r.key] = (r.offset, r.value)
    return out


def test_keyed_updates_are_compacted_to_the_latest_value_at_its_offset(broker_factory, topic_name):
    broker = broker_factory(CLEANER)
    create_topic(broker.bootstrap, topic_name, config=COMPACTED)
    latest = produce_updates(broker.bootstrap, topic_name)
    total = KEYS * UPDATES
    # Everything but the active segment can be cleaned: well under a third of what was written stays.
    recs = cleaned_to(broker, topic_name, total // 3)
    offsets = [r.offset for r in recs]
    assert offsets == sorted(set(offsets))  # no offset twice, in order
    assert latest_of(recs) == latest  # the latest value of every key, at the offset it was acknowledged at
    assert latest_of(kp_consume(broker.bootstrap, topic_name, {0: 0})) == latest
    # The progress survives a restart: the next start reads the same cleaned log and the checkpoint.
    broker.restart(clean=True)
    assert (Path(broker.data_dir) / "cleaner-offset-checkpoint").exists()
    assert [(r.offset, r.key, r.value) for r in ck_consume(broker.bootstrap, topic_name, {0: 0})] == \
        [(r.offset, r.key, r.value) for r in recs]


@pytest.mark.parametrize("broker_settings,topic_config", [
    ({}, {"cleanup.policy": "delete"}),
    ({}, {"min.compaction.lag.ms": "3600000"}),
    ({"log.cleaner.enable": "false"}, {}),
    ({"log.cleaner.backoff.ms": "60000"}, {}),
], ids=["delete-policy", "min-compaction-lag", "cleaner-off", "long-backoff"])
def test_settings_that_keep_every_record(broker_factory, topic_name, broker_settings, topic_config):
    """The controls of the test above: the same writes, and a setting under which nothing may be cleaned yet."""
    broker = broker_factory({**CLEANER, **broker_settings})
    create_topic(broker.bootstrap, topic_name, config={**COMPACTED, **topic_config})
    produce_updates(broker.bootstrap, topic_name, updates=4)
    time.sleep(3)  # thirty passes at the test's backoff
    assert len(ck_consume(broker.bootstrap, topic_name, {0: 0})) == KEYS * 4


@pytest.mark.parametrize("threads", [1, 2])
def test_log_cleaner_threads_clean_partitions_side_by_side(broker_factory, topic_name, threads):
    """Two partitions dirty at the same pass: with two threads both rounds run at once, in two workers."""
    broker = broker_factory({"log.cleaner.backoff.ms": 3000, "log.cleaner.threads": threads})
    create_topic(broker.bootstrap, topic_name, 2, config=COMPACTED)
    outs = [Out(p, b"key-%03d" % k, b"%d-%03d%s" % (r, k, PAD)) for r in range(UPDATES) for k in range(KEYS)
            for p in (0, 1)]
    ck_produce(broker.bootstrap, topic_name, outs, **SMALL_BATCHES)  # well inside one backoff

    def both_cleaned():
        from oncelog.storage.checkpoints import read_checkpoint

        done = read_checkpoint(Path(broker.data_dir) / "cleaner-offset-checkpoint")
        return (topic_name, 0) in done and (topic_name, 1) in done
    wait_until(both_cleaned, timeout=60, interval=0.2, what="both partitions cleaned")

    assert len(cleaner_workers(broker.pid)) == threads  # the pool starts a worker only when every started one is busy


def test_a_tombstone_deletes_its_key_and_goes_after_delete_retention(broker_factory, topic_name):
    broker = broker_factory(CLEANER)
    create_topic(broker.bootstrap, topic_name, config={**COMPACTED, "delete.retention.ms": "3000"})
    produce_updates(broker.bootstrap, topic_name, updates=3)
    gone = [b"key-%03d" % k for k in range(0, KEYS, 2)]
    ck_produce(broker.bootstrap, topic_name, [Out(0, k, None) for k in gone], **SMALL_BATCHES)
    # Enough later writes to close the segment holding the tombstones.
    after = produce_updates(broker.bootstrap, topic_name, updates=2, tag="w")

    def tombstones_gone():
        recs = ck_consume(broker.bootstrap, topic_name, {0: 0})
        return recs if not [r for r in recs if r.value is None] else None
    # The later writes re-create the even keys; what must go is the old values and the tombstones themselves:
    # the tombstones stay until their horizon (delete.retention.ms after the clean that first met them).
    recs = wait_until(tombstones_gone, timeout=60, interval=0.5, what="tombstones removed after their horizon")
    assert latest_of(recs) == after
    assert not [r for r in recs if r.value.startswith(b"v-") and r.key in gone]


def test_aborted_data_is_never_read_committed_and_is_cleaned_away(broker_factory, topic_name):
    broker = broker_factory(CLEANER)
    create_topic(broker.bootstrap, topic_name, config=COMPACTED)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": f"tx-{topic_name}",
                         "linger.ms": 5, **SMALL_BATCHES})
    producer.init_transactions(30)
    for round_ in range(6):
        for commit in (False, True):
            producer.begin_transaction()
            tag = b"c" if commit else b"a"
            for k in range(KEYS):
                producer.produce(topic_name, key=b"key-%03d" % k, value=b"%s-%d-%03d%s" % (tag, round_, k, PAD),
                                 partition=0)
            producer.flush(30)
            (producer.commit_transaction if commit else producer.abort_transaction)(30)
    committed = ck_consume(broker.bootstrap, topic_name, {0: 0}, **{"isolation.level": "read_committed"})
    assert {k: v for k, (_o, v) in latest_of(committed).items()} == {
        b"key-%03d" % k: b"c-5-%03d%s" % (k, PAD) for k in range(KEYS)}
    assert all(r.value.startswith(b"c-") for r in committed)
    # Plain writes after the transactions, so the segments holding them close and can be cleaned.
    latest = produce_updates(broker.bootstrap, topic_name, updates=2, tag="z")

    def aborted_gone():
        recs = ck_consume(broker.bootstrap, topic_name, {0: 0}, **{"isolation.level": "read_uncommitted"})
        return recs if not [r for r in recs if r.value.startswith(b"a-")] else None
    wait_until(aborted_gone, timeout=60, interval=0.5, what="aborted data cleaned away")
    again = ck_consume(broker.bootstrap, topic_name, {0: 0}, **{"isolation.level": "read_committed"})
    assert not [r for r in again if r.value.startswith(b"a-")]
    assert latest_of(again) == latest


def cleaned_once(broker, topic: str) -> bool:
    """The cleaner's checkpoint names the partition: at least one round was swapped in."""
    from oncelog.storage.checkpoints import read_checkpoint

    return (topic, 0) in read_checkpoint(Path(broker.data_dir) / "cleaner-offset-checkpoint")


def test_an_idempotent_producer_goes_on_through_cleans(broker_factory, topic_name):
    """Its older batches are compacted away under it; it keeps its sequence (no UNKNOWN_PRODUCER_ID, no
    OUT_OF_ORDER_SEQUENCE_NUMBER, no epoch bump) because its last batch always stays."""
    broker = broker_factory(CLEANER)
    create_topic(broker.bootstrap, topic_name, config=COMPACTED)
    errors: list[str] = []
    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "linger.ms": 2,
                         "error_cb": lambda e: errors.append(str(e)), **SMALL_BATCHES})
    latest: dict[bytes, bytes] = {}

    def write_round(round_: int) -> None:
        for k in range(KEYS):
            value = b"%d-%03d%s" % (round_, k, PAD)
            producer.produce(topic_name, key=b"key-%03d" % k, value=value, partition=0,
                             on_delivery=lambda err, msg: err and errors.append(str(err)))
            latest[b"key-%03d" % k] = value
        assert producer.flush(30) == 0

    round_ = 0
    deadline = time.monotonic() + 60
    while not cleaned_once(broker, topic_name):  # writes go on while the cleaner rewrites what they wrote before
        assert time.monotonic() < deadline, "no clean in 60 s"
        write_round(round_)
        round_ += 1
    for _ in range(3):  # and on after a clean removed most of its earlier batches
        write_round(round_)
        round_ += 1
    assert errors == []
    recs = cleaned_to(broker, topic_name, KEYS * round_ // 2)
    assert {k: v for k, (_o, v) in latest_of(recs).items()} == latest


@pytest.mark.parametrize("step", ["swap-staged", "swap-committed", "swap-old-deleted"])
def test_a_sigkill_at_each_step_of_the_swap_loses_nothing(broker_factory, topic_name, step):
    broker = broker_factory({**CLEANER, "oncelog.test.crash.at": step})
    create_topic(broker.bootstrap, topic_name, config=COMPACTED)
    pid = broker.pid
    latest = produce_updates(broker.bootstrap, topic_name)
    workers: set[int] = set()

    def died() -> bool:
        workers.update(cleaner_workers(pid))
        return broker.proc.poll() is not None
    wait_until(died, timeout=60, interval=0.01, what=f"the broker to kill itself at {step}")
    assert broker.proc.returncode == -9
    assert workers  # the round ran in a worker process, which must not outlive the broker
    wait_until(lambda: not [w for w in workers if Path(f"/proc/{w}").exists()], timeout=15,
               what="the cleaner's workers to exit after the broker's SIGKILL")
    broker.settings.pop("oncelog.test.crash.at")
    broker.start()
    recs = ck_consume(broker.bootstrap, topic_name, {0: 0})
    assert latest_of(recs) == latest  # every key's latest value at its offset: old or new segments, nothing lost
    offsets = [r.offset for r in recs]
    assert offsets == sorted(set(offsets))
    names = os.listdir(Path(broker.data_dir) / f"{topic_name}-0")
    assert not [n for n in names if n.endswith((".swap", ".swapend"))] and "cleaner-scratch" not in names
    cleaned_to(broker, topic_name, KEYS * UPDATES // 3)  # and the cleaner goes on after the restart


def _batches_of(bootstrap: str, topic: str) -> list:
    """Every batch header of partition 0 from offset 0, as the broker serves them."""
    headers, offset = [], 0
    with Wire(bootstrap) as w:
        while True:
            buf = bytes(fetch_raw(w, topic, 0, offset).records or b"")
            pos = 0
            while pos + 61 <= len(buf):
                h = read_header(buf, pos)
                if pos + h.size > len(buf):
                    break
                headers.append(h)
                pos += h.size
            if pos == 0:
                return headers
            offset = headers[-1].last_offset + 1


def test_the_marker_that_bumped_an_epoch_survives_cleans_and_a_replay(broker_factory, topic_name):
    """A transaction that times out is aborted by the coordinator with the producer's epoch bumped: that marker is
    the only record of the new epoch. Cleaning removes the aborted data and, past delete.retention.ms, markers;
    this one stays, so producer state rebuilt from the cleaned log (no snapshot) still has the bumped epoch."""
    broker = broker_factory({**CLEANER, "transaction.abort.timed.out.transaction.cleanup.interval.ms": 200})
    create_topic(broker.bootstrap, topic_name, config={**COMPACTED, "delete.retention.ms": "0"})
    txn = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": f"{topic_name}-tx",
                    "transaction.timeout.ms": 1000})
    txn.init_transactions(30)
    txn.begin_transaction()
    txn.produce(topic_name, key=b"key-000", value=b"never committed")
    txn.flush(30)
    with Wire(broker.bootstrap) as w:
        ((pid, _state),) = wait_until(
            lambda: [(p, s) for p, s in producers_of(w, topic_name).items()
                     if s.producer_epoch == 1 and s.current_txn_start_offset == -1],
            timeout=30, interval=0.2, what="the timed-out transaction aborted with the epoch bumped to 1")
    del txn  # fenced by the bump; nothing of it is pending

    def batches_of_pid():
        return [h for h in _batches_of(broker.bootstrap, topic_name) if h.producer_id == pid]

    # Each wave of updates makes the log dirty, so a round runs over the whole log again: the first removes the
    # aborted data, the next stamps the marker's delete horizon (now + 0), the ones after find it due.
    stamped_in_wave = None
    for wave in range(6):
        latest = produce_updates(broker.bootstrap, topic_name, tag=f"w{wave}")
        cleaned_to(broker, topic_name, KEYS * UPDATES // 3)
        hs = batches_of_pid()
        if stamped_in_wave is None and all(h.is_control and h.attributes & 0x40 for h in hs):
            stamped_in_wave = wave
        if stamped_in_wave is not None and wave >= stamped_in_wave + 2:
            break
    assert stamped_in_wave is not None and wave >= stamped_in_wave + 2, "the marker was never stamped"
    # Two cleans past its horizon: a marker of an epoch that data batches carry would be gone; this one stays.
    (marker,) = batches_of_pid()
    assert marker.is_control and marker.producer_epoch == 1 and marker.record_count == 1
    assert {k: v for k, (_o, v) in latest_of(ck_consume(broker.bootstrap, topic_name, {0: 0})).items()} == \
        {k: v for k, (_o, v) in latest.items()}

    # Producer state rebuilt from the cleaned log alone: the bumped epoch is still known.
    broker.stop()
    for snap in (Path(broker.data_dir) / f"{topic_name}-0").glob("*.snapshot"):
        snap.unlink()
    broker.start()
    with Wire(broker.bootstrap) as w:
        rebuilt = producers_of(w, topic_name)
    assert pid in rebuilt and rebuilt[pid].producer_epoch == 1
