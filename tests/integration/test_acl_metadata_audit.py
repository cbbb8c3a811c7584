"""What an all-topics Metadata request writes to the authorizer log (`kafka.authorizer.logger`).

Kafka leaves the topics a principal may not DESCRIBE out of an all-topics answer without logging a denial for
each (KafkaApis.handleTopicMetadataRequest: `logIfDenied = !metadataRequest.isAllTopics`); a topic the client
names and may not describe is a denial, logged at INFO. A client with narrow ACLs (the Spark sink's principal,
any consumer refreshing its metadata) asks for all topics again and again, so logging those would fill the log
with a denial per hidden topic per refresh.
"""

from __future__ import annotations

import pytest
from kafka.protocol.metadata import MetadataRequest
from tests.integration.helpers import wait_until
from tests.support.acl_broker import AclBroker
from tests.support.wire import sasl_plain_wire

TOPIC_AUTHORIZATION_FAILED = 29


@pytest.fixture
def broker(tmp_path):
    b = AclBroker(tmp_path).start()
    admin = b.admin()
    from confluent_kafka.admin import NewTopic

    for future in admin.create_topics([NewTopic("visible", 1, 1), NewTopic("hidden", 1, 1)]).values():
        future.result(30)
    yield b
    b.stop()


def metadata(broker: AclBroker, topics: list[str] | None) -> dict[str, int]:
    with sasl_plain_wire(broker.bootstrap, "alice", "alice-secret") as w:
        answer = w.request(MetadataRequest[9](topics=None if topics is None else [(t, []) for t in topics],
                                              allow_auto_topic_creation=False,
                                              include_topic_authorized_operations=False), 9)
    return {t.name: t.error_code for t in answer.topics}


def metadata_denials(broker: AclBroker, since: int) -> list[str]:
    with open(broker.process.log_path, "rb") as fh:
        fh.seek(since)
        text = fh.read().decode(errors="replace")
    return [line for line in text.splitlines()
            if "Principal = User:alice is Denied" in line and "for request = Metadata" in line]


def test_all_topics_metadata_hides_without_logging_denials(broker):
    broker.grant("alice", "TOPIC", "visible", "DESCRIBE")
    mark = broker.process.log_path.stat().st_size
    for _ in range(3):
        assert metadata(broker, None) == {"visible": 0}
    # a named topic is a denial Kafka logs: once it is in the log, the all-topics requests before it are too
    assert metadata(broker, ["hidden"]) == {"hidden": TOPIC_AUTHORIZATION_FAILED}
    denials = wait_until(lambda: metadata_denials(broker, mark), what="the named topic's denial in the log")
    assert len(denials) == 1 and "Topic:LITERAL:hidden" in denials[0], denials
