"""Bad input on the wire: truncated frames, oversized length prefixes, garbage, unknown API keys,
unsupported versions, null where an array may not be null, and a property-based test throwing random
bytes and mutated valid requests (kafka-python encodings of ApiVersions, Metadata, Produce, Fetch,
ListOffsets, CreateTopics and this issue's other admin APIs; bytes flipped, truncated, extended,
spliced with lying lengths) at a running broker.

After each, the broker process is alive and other clients are still served.
"""

from __future__ import annotations

import os
import socket
import struct
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.protocol.admin import (
    CreatePartitionsRequest,
    CreateTopicsRequest,
    DeleteRecordsRequest,
    DescribeClusterRequest,
    DescribeConfigsRequest,
    DescribeLogDirsRequest,
    IncrementalAlterConfigsRequest,
)
from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest
from tests.integration.helpers import (
    Out,
    Wire,
    api_versions_ok,
    ck_consume,
    ck_produce,
    create_topic,
    encode_framed,
    frame,
    produce_request,
)

from oncelog.records.builder import build_batch

UNSUPPORTED_VERSION = 35


def request_header(api_key: int, version: int, correlation_id: int, client_id: bytes = b"bad-input") -> bytes:
    """Request header v1 (non-flexible): key, version, correlation id, client id."""
    return struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id


def closed_without_answer(sock: socket.socket, timeout: float = 10.0) -> bool:
    """True when the broker closes the connection without sending anything."""
    sock.settimeout(timeout)
    try:
        data = sock.recv(65536)
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return data == b""


def still_serving(broker, topic: str | None = None) -> None:
    assert broker.alive(), broker.log_tail()
    assert api_versions_ok(broker.bootstrap)
    if topic is not None:
        n = int(time.time() * 1000)
        (partition, offset), = ck_produce(broker.bootstrap, topic, [Out(0, b"alive", b"%d" % n)])
        got = ck_consume(broker.bootstrap, topic, {0: offset})
        assert [(r.offset, r.value) for r in got] == [(offset, b"%d" % n)]


@pytest.fixture(scope="module")
def alive_topic(module_broker):
    name = "bad-input-alive"
    create_topic(module_broker.bootstrap, name, 1)
    return name


def connect(broker) -> socket.socket:
    return socket.create_connection(("127.0.0.1", broker.port), timeout=10)


# -- framing ----------------------------------------------------------------------------------------------


def test_truncated_frame_then_close(module_broker, alive_topic):
    req = encode_framed(MetadataRequest[9](topics=None, allow_auto_topic_creation=False,
                                           include_topic_authorized_operations=False), 9)
    for cut in (1, 3, 4, 10, len(req) - 1):
        with connect(module_broker) as s:
            s.sendall(req[:cut])
    still_serving(module_broker, alive_topic)


def test_truncated_frame_does_not_block_others(module_broker, alive_topic):
    """A client that sends half a frame and stalls holds only its own connection."""
    stalled = [connect(module_broker) for _ in range(5)]
    try:
        for i, s in enumerate(stalled):
            s.sendall(struct.pack(">i", 1000) + b"x" * (10 * i))
        still_serving(module_broker, alive_topic)
    finally:
        for s in stalled:
            s.close()


def test_truncated_body_in_a_complete_frame(module_broker, alive_topic):
    """The frame is whole but the request inside ends early: a malformed request closes the connection."""
    body = encode_framed(CreateTopicsRequest[5](topics=[CreateTopicsRequest[5].CreatableTopic(
        name="never-created", num_partitions=1, replication_factor=1, assignments=[], configs=[])],
        timeout_ms=1000, validate_only=False), 5)[4:]
    with connect(module_broker) as s:
        s.sendall(frame(body[: len(body) - 6]))
        assert closed_without_answer(s)
    with connect(module_broker) as s:
        s.sendall(frame(request_header(3, 1, 7)[:7]))  # shorter than its own header
        assert closed_without_answer(s)
    still_serving(module_broker, alive_topic)


@pytest.mark.parametrize("size", [104857601, 0x7FFFFFFF, 0, -1, -(2**31)])
def test_absurd_length_prefix(module_broker, alive_topic, size):
    with connect(module_broker) as s:
        s.sendall(struct.pack(">i", size) + b"\x00" * 64)
        assert closed_without_answer(s)
    still_serving(module_broker, alive_topic)


def test_socket_request_max_bytes(broker_factory, topic_name):
    broker = broker_factory({"socket.request.max.bytes": 4096})
    create_topic(broker.bootstrap, topic_name, 1)
    small = encode_framed(produce_request(topic_name, 0, build_batch([(b"k", b"x" * 1000)])), 9)
    big = encode_framed(produce_request(topic_name, 0, build_batch([(b"k", b"x" * 5000)])), 9)
    assert len(small) - 4 <= 4096 < len(big) - 4
    with Wire(broker.bootstrap) as w:
        w.send_raw(small)
        assert len(w.recv_frame()) > 0
        w.send_raw(big)
        assert closed_without_answer(w.sock)
    # a length prefix one over the limit is refused before any body arrives
    with connect(broker) as s:
        s.sendall(struct.pack(">i", 4097))
        assert closed_without_answer(s)
    still_serving(broker, topic_name)


@pytest.mark.parametrize("seed", range(5))
def test_garbage(module_broker, alive_topic, seed):
    rnd = os.urandom(4096) if seed else b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n"
    with connect(module_broker) as s:
        s.sendall(rnd)
        s.settimeout(10)
        try:
            while s.recv(65536):
                pass
        except (ConnectionResetError, TimeoutError):
            pass
    still_serving(module_broker, alive_topic)


# -- API keys and versions --------------------------------------------------------------------------------


@pytest.mark.parametrize("api_key", [999, -1, 57, 1000 + 18])
def test_unknown_api_key_closes(module_broker, alive_topic, api_key):
    with connect(module_broker) as s:
        s.sendall(frame(request_header(api_key, 0, 42) + b"\x00" * 16))
        assert closed_without_answer(s)
    still_serving(module_broker, alive_topic)


def _supported(bootstrap: str) -> list[tuple[int, int, int]]:
    with Wire(bootstrap) as w:
        resp = w.request(ApiVersionsRequest[3](client_software_name="t", client_software_version="1"), 3)
    assert resp.error_code == 0
    return [(k.api_key, k.min_version, k.max_version) for k in resp.api_keys]


@pytest.mark.parametrize("version", [5, 99, 32767])
def test_unsupported_api_versions_version_is_answered_in_v0(module_broker, alive_topic, version):
    supported = _supported(module_broker.bootstrap)
    with Wire(module_broker.bootstrap) as w:
        # a flexible-looking body that a v0 parser must not need to understand
        w.send_raw(frame(request_header(18, version, 4242) + b"\x02x\x021\x00"))
        answer = w.recv_frame()
    correlation_id, error_code, count = struct.unpack_from(">ihi", answer, 0)
    assert (correlation_id, error_code) == (4242, UNSUPPORTED_VERSION)
    entries = [struct.unpack_from(">hhh", answer, 10 + 6 * i) for i in range(count)]
    assert len(answer) == 10 + 6 * count  # v0: no throttle time, no tagged fields
    assert entries == supported
    assert (18, 0, 4) in entries
    still_serving(module_broker, alive_topic)


@pytest.mark.parametrize("version", [13, 99, -1])
def test_unsupported_metadata_version_closes(module_broker, alive_topic, version):
    with connect(module_broker) as s:
        s.sendall(frame(request_header(3, version, 5) + b"\x00\x00\x00\x00"))
        assert closed_without_answer(s)
    still_serving(module_broker, alive_topic)


@pytest.mark.parametrize("api_key,version", [(0, 2), (1, 3), (2, 0), (19, 1), (0, 12)])
def test_versions_below_or_above_the_advertised_range_close(module_broker, api_key, version):
    supported = {k: (lo, hi) for k, lo, hi in _supported(module_broker.bootstrap)}
    lo, hi = supported[api_key]
    assert not lo <= version <= hi
    with connect(module_broker) as s:
        s.sendall(frame(request_header(api_key, version, 5) + b"\x00" * 32))
        assert closed_without_answer(s)
    assert api_versions_ok(module_broker.bootstrap)


def test_requests_before_a_bad_one_are_answered(module_broker, topic_name):
    """A bad request closes the connection, but what came before it on that connection is answered first."""
    create_topic(module_broker.bootstrap, topic_name, 1)
    good = encode_framed(produce_request(topic_name, 0, build_batch([(b"k", b"v")]), acks=1), 9, correlation_id=1)
    bad = frame(request_header(999, 0, 2))
    with connect(module_broker) as s:
        s.sendall(good + bad)  # one write: both are read before either is handled
        s.settimeout(10)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    assert len(data) >= 8, "no answer for the Produce request before the connection was closed"
    size, correlation_id = struct.unpack_from(">ii", data, 0)
    assert correlation_id == 1
    assert len(data) == 4 + size  # exactly one answer, then the close


def _null_array_requests() -> list:
    def hdr(key: int, version: int) -> bytes:
        return request_header(key, version, 77)

    return [
        pytest.param("PRODUCE", 8, hdr(0, 8) + struct.pack(">hhii", -1, 1, 1000, -1), id="produce"),
        pytest.param("FETCH", 8, hdr(1, 8) + struct.pack(">iiiibiiii", -1, 0, 0, 1000, 0, 0, -1, -1, -1), id="fetch"),
        pytest.param("LIST_OFFSETS", 5, hdr(2, 5) + struct.pack(">ibi", -1, 0, -1), id="list-offsets"),
        pytest.param("CREATE_TOPICS", 4, hdr(19, 4) + struct.pack(">iib", -1, 1000, 0), id="create-topics"),
        pytest.param("DELETE_TOPICS", 3, hdr(20, 3) + struct.pack(">ii", -1, 1000), id="delete-topics"),
        pytest.param("CREATE_PARTITIONS", 1, hdr(37, 1) + struct.pack(">iib", -1, 1000, 0), id="create-partitions"),
        pytest.param("DESCRIBE_CONFIGS", 2, hdr(32, 2) + struct.pack(">ib", -1, 0), id="describe-configs"),
        pytest.param("DELETE_RECORDS", 1, hdr(21, 1) + struct.pack(">ii", -1, 1000), id="delete-records"),
        pytest.param("INCREMENTAL_ALTER_CONFIGS", 0, hdr(44, 0) + struct.pack(">ib", -1, 0),
                     id="incremental-alter-configs"),
    ]


@pytest.mark.parametrize("api,version,request_bytes", _null_array_requests())
def test_null_for_a_non_nullable_array_is_malformed(module_broker, alive_topic, api, version, request_bytes):
    """A -1 length where the schema has a non-nullable array: the request is malformed; the connection is closed
    as for any malformed request, not by a crashing handler."""
    crashed = f"handler for {api} v{version} failed"
    before = module_broker.log_tail(100000).count(crashed)
    with connect(module_broker) as s:
        s.sendall(frame(request_bytes))
        assert closed_without_answer(s)
    assert module_broker.log_tail(100000).count(crashed) == before
    still_serving(module_broker, alive_topic)


# -- property-based -----------------------------------------------------------------------------------------


def _valid_requests() -> list[bytes]:
    batch = bytes(build_batch([(b"k", b"v" * 20), (None, b"w"), (b"k2", None)]))
    out = [encode_framed(ApiVersionsRequest[v](client_software_name="f", client_software_version="1")
                         if v >= 3 else ApiVersionsRequest[v](), v) for v in range(4)]
    for v in (0, 4, 9, 12):
        kwargs = dict(topics=[MetadataRequest[v].MetadataRequestTopic(name="fuzz-target", topic_id=None)],
                      allow_auto_topic_creation=False)
        if v >= 8:
            kwargs.update(include_topic_authorized_operations=False)
        if v in (8, 9, 10):
            kwargs.update(include_cluster_authorized_operations=False)
        out.append(encode_framed(MetadataRequest[v](**kwargs), v))
    for v in (3, 8, 9, 11):
        out.append(encode_framed(produce_request("fuzz-target", 0, batch, acks=1, version=v), v))
    for v in (4, 11, 12):
        req = FetchRequest[v]
        ft = req.FetchTopic
        fp = ft.FetchPartition
        kwargs = dict(replica_id=-1, max_wait_ms=10, min_bytes=1, max_bytes=4096, isolation_level=0,
                      topics=[ft(topic="fuzz-target", partitions=[fp(partition=0, fetch_offset=0, log_start_offset=-1,
                                                                     partition_max_bytes=4096,
                                                                     current_leader_epoch=-1)])])
        if v >= 7:
            kwargs.update(session_id=0, session_epoch=-1, forgotten_topics_data=[])
        if v >= 11:
            kwargs["rack_id"] = ""
        out.append(encode_framed(req(**kwargs), v))
    for v in (1, 5, 7):
        req = ListOffsetsRequest[v]
        lt = req.ListOffsetsTopic
        kwargs = dict(replica_id=-1, topics=[lt(name="fuzz-target", partitions=[
            lt.ListOffsetsPartition(partition_index=0, timestamp=-1, current_leader_epoch=-1)])])
        if v >= 2:
            kwargs["isolation_level"] = 0
        out.append(encode_framed(req(**kwargs), v))
    for v in (2, 5, 7):
        req = CreateTopicsRequest[v]
        ct = req.CreatableTopic
        out.append(encode_framed(req(topics=[ct(name="fuzz-new", num_partitions=2, replication_factor=1,
                                                assignments=[], configs=[ct.CreatableTopicConfig(
                                                    name="retention.ms", value="1000")])],
                                     timeout_ms=1000, validate_only=True), v))
    # The rest of this admin APIs; the ones that change something aim at "fuzz-admin".
    for v in (0, 2):
        req = DeleteRecordsRequest[v]
        t = req.DeleteRecordsTopic
        out.append(encode_framed(req(topics=[t(name="fuzz-admin", partitions=[
            t.DeleteRecordsPartition(partition_index=0, offset=0)])], timeout_ms=1000), v))
    for v in (1, 4):
        req = DescribeConfigsRequest[v]
        res = req.DescribeConfigsResource
        out.append(encode_framed(req(resources=[res(resource_type=2, resource_name="fuzz-target",
                                                    configuration_keys=["retention.ms"]),
                                                res(resource_type=4, resource_name="0", configuration_keys=None)],
                                     include_synonyms=True, include_documentation=True), v))
    for v in (0, 1):
        req = IncrementalAlterConfigsRequest[v]
        res = req.AlterConfigsResource
        out.append(encode_framed(req(resources=[res(resource_type=2, resource_name="fuzz-admin", configs=[
            res.AlterableConfig(name="retention.ms", config_operation=0, value="100000"),
            res.AlterableConfig(name="cleanup.policy", config_operation=2, value="compact")])],
            validate_only=True), v))
    for v in (0, 2):
        req = CreatePartitionsRequest[v]
        out.append(encode_framed(req(topics=[req.CreatePartitionsTopic(name="fuzz-admin", count=3, assignments=None)],
                                     timeout_ms=1000, validate_only=True), v))
    out.append(encode_framed(DescribeClusterRequest[0](include_cluster_authorized_operations=False), 0))
    out.append(encode_framed(DescribeClusterRequest[1](include_cluster_authorized_operations=False,
                                                       endpoint_type=1), 1))
    for v in (1, 4):
        req = DescribeLogDirsRequest[v]
        out.append(encode_framed(req(topics=[req.DescribableLogDirTopic(topic="fuzz-target", partitions=[0, 1])]), v))
    return out


VALID = _valid_requests()
EVIL = [struct.pack(">i", 0x7FFFFFFF), struct.pack(">i", -1), struct.pack(">h", -2), struct.pack(">h", 0x7FFF),
        b"\xff\xff\xff\xff\x0f", b"\x80\x80\x80\x80\x80\x01", b"\x00", b"\xff"]


@st.composite
def mutated(draw) -> bytes:
    data = bytearray(draw(st.sampled_from(VALID)))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "truncate", "extend", "splice", "set"]))
        if len(data) <= 5:
            break
        pos = draw(st.integers(4, len(data) - 1))  # keep the length prefix; fixed below or not
        if kind == "flip":
            data[pos] ^= draw(st.integers(1, 255))
        elif kind == "truncate":
            del data[pos:]
        elif kind == "extend":
            data += draw(st.binary(min_size=1, max_size=64))
        elif kind == "splice":
            evil = draw(st.sampled_from(EVIL))
            data[pos:pos + len(evil)] = evil
        else:
            data[pos] = draw(st.sampled_from([0x00, 0xFF, 0x7F, 0x80]))
    if draw(st.booleans()):  # a consistent frame, so the broker must parse the damaged request
        struct.pack_into(">i", data, 0, len(data) - 4)
    return bytes(data)


PAYLOADS = st.one_of(
    mutated(),
    mutated(),
    mutated(),
    st.binary(min_size=0, max_size=512),
    st.binary(min_size=0, max_size=256).map(lambda b: frame(b)),
    st.tuples(st.integers(-(2**15), 2**15 - 1), st.integers(-(2**15), 2**15 - 1), st.binary(max_size=128)).map(
        lambda t: frame(request_header(t[0], t[1], 9) + t[2])),
)


@pytest.fixture(scope="module")
def fuzz_broker(module_broker):
    create_topic(module_broker.bootstrap, "fuzz-target", 2)
    create_topic(module_broker.bootstrap, "fuzz-admin", 1)
    return module_broker


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), derandomize=False)
@given(payload=PAYLOADS)
def test_random_and_mutated_requests(fuzz_broker, payload):
    with connect(fuzz_broker) as s:
        try:
            s.sendall(payload)
            s.settimeout(0.1)
            while s.recv(65536):
                pass
        except (TimeoutError, ConnectionResetError, BrokenPipeError):
            pass
    assert fuzz_broker.alive(), fuzz_broker.log_tail()
    assert api_versions_ok(fuzz_broker.bootstrap, timeout=5)


def test_after_the_fuzzing_the_broker_still_works(fuzz_broker):
    still_serving(fuzz_broker, "fuzz-target")
    # No handler crashed on what the fuzzer sent: malformed input is rejected by the decoders.
    log = fuzz_broker.log_tail(100000)
    crashes = log.split("Traceback (most recent call last):")[1:]
    assert not crashes, crashes[:2]
