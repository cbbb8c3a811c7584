"""CreateTopics builds a topic's files on a worker thread (docs/latency.md, issue 24): 2,000 partitions cost about
3 s of directories, files and fsyncs here, which used to hold the event loop and so every client of the broker.
While they are built, other requests are answered, the topic is not visible yet, and its name is taken."""

from __future__ import annotations

import select
import time

from kafka.protocol.admin import CreateTopicsRequest
from kafka.protocol.metadata import MetadataRequest
from tests.integration.helpers import produce_raw
from tests.support.broker import BrokerProcess
from tests.support.wire import Wire

from oncelog.errors import ErrorCode
from oncelog.records.builder import build_batch

WIDE = 2000


def _create(name: str, partitions: int) -> CreateTopicsRequest:
    ct = CreateTopicsRequest[5]
    return ct(topics=[ct.CreatableTopic(name=name, num_partitions=partitions, replication_factor=1, assignments=[],
                                        configs=[])], timeout_ms=60000, validate_only=False)


def _metadata(wire: Wire, topic: str) -> object:
    return wire.request(MetadataRequest[9](topics=[MetadataRequest[9].MetadataRequestTopic(name=topic)],
                                           allow_auto_topic_creation=False, include_cluster_authorized_operations=False,
                                           include_topic_authorized_operations=False), 9).topics[0]


def test_a_wide_create_topics_leaves_the_loop_to_other_clients(tmp_path):
    data = tmp_path / "data"
    with BrokerProcess(data) as broker, Wire(broker.bootstrap, timeout=120) as creator, \
            Wire(broker.bootstrap) as other:
        creator.request(_create("wide", WIDE), 5, expect_response=False)
        deadline = time.monotonic() + 60
        while not (data / "wide-0").exists():  # the broker has begun building the topic
            assert time.monotonic() < deadline, broker.log_tail()
            time.sleep(0.005)
        # Answered while the topic is being built (before, the loop was busy until all of it was done, so this
        # answer came only once the topic existed): not visible yet, and its name is taken.
        topic = _metadata(other, "wide")
        assert topic.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert not (data / f"wide-{WIDE - 1}").exists()
        again = other.request(_create("wide", 3), 5).topics[0]
        assert again.error_code == ErrorCode.TOPIC_ALREADY_EXISTS
        assert not select.select([creator.sock], [], [], 0)[0], "the wide CreateTopics is still being answered"
        creator.recv_frame()  # the answer to the wide CreateTopics; what it did, Metadata shows
        topic = _metadata(other, "wide")
        assert topic.error_code == 0 and len(topic.partitions) == WIDE
        part = produce_raw(other, "wide", WIDE - 1, build_batch([(None, b"x", (), int(time.time() * 1000))]))
        assert (part.error_code, part.base_offset) == (0, 0)
