"""The event loop monitor in a running broker (broker/loop_monitor.py, issue 24): a request that holds the loop
is logged with the stack that held it and counted; the lag histogram fills from the start.

The stall used here is a real one a user can cause: CreatePartitions adding hundreds of partitions creates (and
fdatasyncs) each partition's files on the loop. (CreateTopics did the same until it moved that work to a worker
thread: test_create_topics_off_loop.py.)"""

from __future__ import annotations

import time

from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from tests.integration.helpers import metric, scrape
from tests.support.broker import BrokerProcess


def test_a_stall_is_logged_with_its_stack_and_counted(tmp_path):
    with BrokerProcess(tmp_path / "data", {"oncelog.loop.stall.threshold.ms": 20}, metrics=True) as broker:
        time.sleep(1.0)  # idle: heartbeats only
        assert metric(scrape(broker.metrics_port), "oncelog_event_loop_lag_seconds_count") >= 50
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic("wide", 1, 1)])["wide"].result(60)
        admin.create_partitions([NewPartitions("wide", 401)])["wide"].result(60)
        deadline = time.monotonic() + 10
        while "event loop stalled" not in broker.log_path.read_text(errors="replace"):
            assert time.monotonic() < deadline, broker.log_tail()
            time.sleep(0.1)
        text = broker.log_path.read_text(errors="replace")
        line = text[text.index("event loop stalled"):]
        assert "handle_create_partitions" in line and "create_partitions" in line, line[:3000]
        assert "runners.py" not in line.split("WARNING", 1)[0]  # asyncio's own frames are left out
        assert metric(scrape(broker.metrics_port), "oncelog_event_loop_stalls_total") >= 1


def test_fsync_rounds_are_timed_in_prometheus(tmp_path):
    """oncelog_fsync_round_seconds / oncelog_fsync_disk_seconds: every group-commit round an acks=all produce
    waited for is counted, with the disk's share no larger than the round (storage/flusher.py FlushRound)."""
    from confluent_kafka import Producer

    with BrokerProcess(tmp_path / "data", {}, metrics=True) as broker:
        before = metric(scrape(broker.metrics_port), "oncelog_fsync_round_seconds_count")
        p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 0})
        for i in range(5):
            p.produce("timed", f"v{i}".encode())
            assert p.flush(30) == 0  # one acks=all answer at a time: each waits for a round of its own
        text = scrape(broker.metrics_port)
        rounds = metric(text, "oncelog_fsync_round_seconds_count")
        assert rounds - before >= 5, (before, rounds)
        assert metric(text, "oncelog_fsync_disk_seconds_count") == rounds
        assert 0 < metric(text, "oncelog_fsync_disk_seconds_sum") <= metric(text, "oncelog_fsync_round_seconds_sum")
