"""In-process fuzzing of everything the broker decodes from bytes it did not write itself (or that a crash may
have damaged): request headers and bodies of every API and version it serves, produced record batches, batches
read back from the log, transaction markers, producer-state snapshots, transaction-log and group-log records.

The oracle is each decoder's contract: on bad input it raises its documented exception type and nothing
else (an IndexError, struct.error, UnicodeDecodeError... leaking out is a bug: the dispatcher treats anything
but ProtocolError as a broker fault, and the loaders would stop a restart). The produce validator never
raises at all, and never accepts a batch whose CRC is wrong.
"""

from __future__ import annotations

import struct
from collections import Counter

import crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from oncelog.config import load_broker_config, parse_topic_overrides
from oncelog.coordinator.group import records as group_records
from oncelog.coordinator.txn import log_format
from oncelog.protocol.apis import request_header_flexible
from oncelog.protocol.fetch_codec import decode_fetch_request
from oncelog.protocol.header import decode_request_header
from oncelog.protocol.messages import decode_request
from oncelog.protocol.primitives import ProtocolError
from oncelog.protocol.produce_codec import decode_produce_request
from oncelog.records.batch import HEADER_SIZE, LOG_OVERHEAD, crc_ok, read_header, rewrite_crc
from oncelog.records.control import ControlRecordError, parse_marker
from oncelog.records.reader import CorruptRecordsError, read_batches
from oncelog.records.validate import validate_produce
from oncelog.storage.producer_state import decode_snapshot
from tests.fuzz import corpus
from tests.fuzz.mutate import FUZZ_SETTINGS, damaged, record_iterations, with_fixed_crc

REQUESTS = corpus.request_bodies()
API_VERSIONS = sorted(REQUESTS)
RUNS: Counter[str] = Counter()


@pytest.fixture(scope="module", autouse=True)
def _report_iterations():
    yield
    for target, count in sorted(RUNS.items()):
        record_iterations(target, count)
    print("fuzz inputs per target:", dict(RUNS))


def _fix_batch_crc(buf: bytearray) -> None:
    if len(buf) >= HEADER_SIZE:
        size = min(read_header(buf).length + LOG_OVERHEAD, len(buf))
        rewrite_crc(buf, 0, size)


def _fix_snapshot_crc(buf: bytearray) -> None:
    if len(buf) >= 6:
        struct.pack_into(">I", buf, 2, crc32c.crc32c(bytes(buf[6:])))


def _request(api_version: tuple[int, int]) -> st.SearchStrategy:
    return st.tuples(st.just(api_version), damaged(REQUESTS[api_version]))


REQUEST_INPUTS = st.sampled_from(API_VERSIONS).flatmap(_request)
BATCHES = st.one_of(damaged(corpus.record_batches()),
                    damaged(corpus.record_batches()).map(with_fixed_crc(_fix_batch_crc)))


# -- the wire -----------------------------------------------------------------------------------------------

@FUZZ_SETTINGS
@given(REQUEST_INPUTS, st.booleans())
def test_request_header(request_input, flip_flexible):
    (api_key, version), body = request_input
    frame = corpus.frame(api_key, version, body)
    flexible = request_header_flexible(api_key, version) != flip_flexible
    RUNS["request header"] += 1
    try:
        header, offset = decode_request_header(frame, flexible)
    except ProtocolError:
        return
    assert 10 <= offset <= len(frame)
    assert header.api_key == api_key


@FUZZ_SETTINGS
@given(REQUEST_INPUTS)
def test_request_bodies(request_input):
    (api_key, version), body = request_input
    RUNS["request bodies"] += 1
    view = memoryview(body)
    try:
        if api_key == 0:
            decoded = decode_produce_request(view, version)
            for _, partitions in decoded.topics:
                for _, records in partitions:
                    assert records is None or len(records) <= len(body)
        elif api_key == 1:
            decode_fetch_request(view, version)
        else:
            decode_request(api_key, version, view)
    except ProtocolError:
        pass


# -- record batches -------------------------------------------------------------------------------------------

_BROKER = load_broker_config()
TOPIC_CONFIGS = [
    _BROKER.topic_config(),
    _BROKER.topic_config(parse_topic_overrides({"cleanup.policy": "compact"})),
    _BROKER.topic_config(parse_topic_overrides({"message.timestamp.before.max.ms": "3600000",
                                                "message.timestamp.after.max.ms": "3600000"})),
    _BROKER.topic_config(parse_topic_overrides({"message.timestamp.type": "LogAppendTime"})),
]


@FUZZ_SETTINGS
@given(BATCHES, st.sampled_from(range(len(TOPIC_CONFIGS))), st.integers(3, 11), st.booleans())
def test_produce_validation_never_raises(batch, config_index, api_version, walk):
    RUNS["record batch validator"] += 1
    result = validate_produce(bytearray(batch), TOPIC_CONFIGS[config_index], 1_700_000_000_000,
                              partition="fuzz-0", api_version=api_version, walk_records=walk)
    if result.ok:
        header = read_header(batch)
        assert header.length + LOG_OVERHEAD == len(batch)
        assert crc_ok(batch, 0, header), "accepted a batch whose CRC does not match"
    else:
        assert result.error != 0


@FUZZ_SETTINGS
@given(BATCHES)
def test_batch_reader(batch):
    RUNS["record batch reader"] += 1
    try:
        read_batches(batch)
    except CorruptRecordsError:
        pass


@FUZZ_SETTINGS
@given(BATCHES)
def test_transaction_marker_parser(batch):
    RUNS["transaction marker parser"] += 1
    try:
        parse_marker(batch)
    except ControlRecordError:
        pass


# -- what the broker reads back at startup ----------------------------------------------------------------------

SNAPSHOTS = st.one_of(damaged(corpus.snapshots()),
                      damaged(corpus.snapshots()).map(with_fixed_crc(_fix_snapshot_crc)))


@FUZZ_SETTINGS
@given(SNAPSHOTS, st.integers(1, 8))
def test_producer_state_snapshot_reader(data, max_batches):
    RUNS["producer-state snapshot reader"] += 1
    try:
        entries = decode_snapshot(data, max_batches)
    except ValueError:
        return
    assert all(len(e.batches) <= max_batches for e in entries)


TXN_KEYS, TXN_VALUES = corpus.txn_log_records()


@FUZZ_SETTINGS
@given(damaged(TXN_KEYS), damaged(TXN_VALUES))
def test_transaction_log_records(key, value):
    RUNS["transaction log reader"] += 1
    try:
        log_format.decode_key(key)
    except ProtocolError:
        pass
    try:
        log_format.decode_value("tx", value)
    except ProtocolError:
        pass


GROUP_KEYS, OFFSET_VALUES, GROUP_VALUES = corpus.group_log_records()


@FUZZ_SETTINGS
@given(damaged(GROUP_KEYS), damaged(OFFSET_VALUES), damaged(GROUP_VALUES))
def test_group_log_records(key, offset_value, group_value):
    RUNS["group log reader"] += 1
    for decode, data in ((group_records.decode_key, key), (group_records.decode_offset_value, offset_value),
                         (group_records.decode_group_value, group_value)):
        try:
            decode(data)
        except group_records.RecordFormatError:
            pass
