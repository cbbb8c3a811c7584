"""AlterReplicaLogDirs (API 34) on the single node, at the wire: kafka-reassign-partitions sends it for every
replica of a plan whose "log_dirs" name a directory instead of "any" (the form its own rollback JSON and many
hand-written plans take). A broker has one log directory, the one DescribeLogDirs names: a replica asked into it
is where it should be (NONE); any other path is LOG_DIR_NOT_FOUND, and a partition that does not exist is
UNKNOWN_TOPIC_OR_PARTITION, as Kafka answers. The cluster-mode answers (REPLICA_NOT_AVAILABLE for a partition with
no replica on the broker asked) and the tool end to end are in tests/cluster/test_kafka_tools.py."""

from __future__ import annotations

import pytest
from kafka.protocol.admin import AlterReplicaLogDirsRequest, DescribeLogDirsRequest
from kafka.protocol.metadata import ApiVersionsRequest
from tests.integration.helpers import Wire, create_topic

NONE = 0
UNKNOWN_TOPIC_OR_PARTITION = 3
LOG_DIR_NOT_FOUND = 57
ALTER_REPLICA_LOG_DIRS = 34


def _log_dir(w: Wire) -> str:
    resp = w.request(DescribeLogDirsRequest[4](topics=None), 4)
    (result,) = resp.results
    return result.log_dir


def _alter(w: Wire, version: int, dirs: dict[str, dict[str, list[int]]]) -> dict[tuple[str, int], int]:
    req = AlterReplicaLogDirsRequest[version]
    d = req.AlterReplicaLogDir
    t = d.AlterReplicaLogDirTopic
    message = req(dirs=[d(path=path, topics=[t(name=name, partitions=parts) for name, parts in topics.items()])
                        for path, topics in dirs.items()])
    resp = w.request(message, version)
    assert resp.throttle_time_ms == 0
    return {(r.topic_name, p.partition_index): p.error_code for r in resp.results for p in r.partitions}


def test_api_versions_advertises_alter_replica_log_dirs_v1_to_v2(module_broker):
    with Wire(module_broker.bootstrap) as w:
        resp = w.request(ApiVersionsRequest[3](client_software_name="t", client_software_version="1"), 3)
    versions = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
    assert versions[ALTER_REPLICA_LOG_DIRS] == (1, 2)


@pytest.mark.parametrize("version", [1, 2])
def test_a_move_into_the_broker_s_own_log_dir_is_accepted_and_any_other_path_refused(module_broker, topic_name,
                                                                                     version):
    create_topic(module_broker.bootstrap, topic_name, 2)
    other = f"{topic_name}-other"
    create_topic(module_broker.bootstrap, other, 1)
    with Wire(module_broker.bootstrap) as w:
        here = _log_dir(w)
        answers = _alter(w, version, {
            here: {topic_name: [0, 1, 7], "no-such-topic": [0]},
            f"{here}-elsewhere": {other: [0]},
            "data": {other: [1]},  # relative: never a log dir's name
        })
        assert answers == {
            (topic_name, 0): NONE, (topic_name, 1): NONE,
            (topic_name, 7): UNKNOWN_TOPIC_OR_PARTITION, ("no-such-topic", 0): UNKNOWN_TOPIC_OR_PARTITION,
            (other, 0): LOG_DIR_NOT_FOUND, (other, 1): LOG_DIR_NOT_FOUND,
        }
        # nothing moved: the partitions are still listed in the same directory
        (result,) = w.request(DescribeLogDirsRequest[4](topics=None), 4).results
        assert result.log_dir == here
        assert {t.name: sorted(p.partition_index for p in t.partitions) for t in result.topics
                if t.name in (topic_name, other)} == {topic_name: [0, 1], other: [0]}
