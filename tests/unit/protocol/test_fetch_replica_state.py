"""A follower's broker epoch in a Fetch request: the ReplicaState tagged field (Fetch v15's tag 1), which oncelog's
brokers also send at v12, read next to ClusterId (tag 0) and unknown tags."""

from __future__ import annotations

import pytest

from oncelog.protocol import client_codecs as codecs
from oncelog.protocol.apis import ApiKey
from oncelog.protocol.fetch_codec import decode_fetch_request, encode_replica_state_tag
from oncelog.protocol.primitives import EMPTY_TAGS, ProtocolError, encode_compact_string, encode_uvarint

REQUEST = {
    "replica_id": 2, "max_wait_ms": 500, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
    "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [], "rack_id": "",
    "topics": [{"topic": "t", "partitions": [{"partition": 0, "current_leader_epoch": 3, "fetch_offset": 5,
                                              "last_fetched_epoch": 2, "log_start_offset": 0,
                                              "partition_max_bytes": 1000}]}],
}


def body_with_tags(tags: bytes) -> memoryview:
    body = codecs.encode_request(ApiKey.FETCH, 12, REQUEST)
    assert body[-1:] == EMPTY_TAGS
    return memoryview(body[:-1] + tags)


def test_without_replica_state_the_epoch_is_unknown():
    req = decode_fetch_request(body_with_tags(EMPTY_TAGS), 12)
    assert (req.replica_id, req.replica_epoch) == (2, -1)


def test_replica_state_carries_the_broker_epoch():
    req = decode_fetch_request(body_with_tags(encode_replica_state_tag(2, 4_294_967_311)), 12)
    assert (req.replica_id, req.replica_epoch) == (2, 4_294_967_311)
    assert req.topics[0].partitions[0].fetch_offset == 5


def test_replica_state_beside_cluster_id_and_unknown_tags():
    cluster_id = encode_compact_string("abc")
    state = encode_replica_state_tag(2, 99)[1:]  # its (tag, size, payload), without the count
    unknown = encode_uvarint(7) + encode_uvarint(2) + b"zz"
    tags = encode_uvarint(3) + encode_uvarint(0) + encode_uvarint(len(cluster_id)) + cluster_id + state + unknown
    assert decode_fetch_request(body_with_tags(tags), 12).replica_epoch == 99


def test_a_tag_longer_than_the_request_is_refused():
    with pytest.raises(ProtocolError):
        decode_fetch_request(body_with_tags(encode_uvarint(1) + encode_uvarint(1) + encode_uvarint(50) + b"x"), 12)
