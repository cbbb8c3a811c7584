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
