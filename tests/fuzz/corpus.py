"""Seed inputs for the fuzzers: valid bytes of every format the broker reads, built by independent encoders.

Mutating valid inputs gets past the first length check into the deep parts of a decoder far more often than
random bytes do. Requests are encoded by kafka-python's schema codecs (not the broker's), with every array
holding one element so nested structures are present; record batches by the client-side builder with every
codec; snapshots, transaction-log and group-log records by their own encoders.
"""

from __future__ import annotations

import functools
from collections import deque
from typing import Any

from oncelog.broker.handlers import HANDLERS
from oncelog.coordinator.group import records as group_records
from oncelog.coordinator.txn import log_format
from oncelog.coordinator.txn.metadata import TransactionMetadata, TxnState
from oncelog.protocol.apis import SPECS, ApiKey, request_header_flexible
from oncelog.protocol.messages import REQUESTS
from oncelog.records.batch import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
)
from oncelog.records.builder import build_batch
from oncelog.records.control import build_marker
from oncelog.storage.producer_state import CachedBatch, ProducerEntry, encode_snapshot

TOPIC = "fuzz-topic"
CODECS = (COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_SNAPPY, COMPRESSION_LZ4, COMPRESSION_ZSTD)

_PRIMITIVES: dict[str, Any] = {
    "int8": 1, "int16": 1, "int32": 1, "int64": 1, "uint16": 1, "uint32": 1, "float64": 0.5, "bool": True,
    "string": TOPIC, "bytes": b"fuzz", "records": None, "uuid": None,
}


def _fill(struct: Any, version: int) -> dict[str, Any]:
    """Values for every field of `struct` valid at `version`: one element per array, plausible scalars."""
    values: dict[str, Any] = {}
    for name, field in struct.fields.items():
        if not field.for_version_q(version):
            continue
        if field.is_struct_array():
            values[name] = [field.data_class(**_fill(field, version))]
        elif field.is_struct():
            values[name] = field.data_class(**_fill(field, version))
        elif field.is_array():
            element = field.type_str.removeprefix("[]")
            values[name] = [_PRIMITIVES.get(element, 1)]
        elif field.type_str in _PRIMITIVES and _PRIMITIVES[field.type_str] is not None:
            values[name] = _PRIMITIVES[field.type_str]
    return values


def _encode(api_key: int, version: int, message: Any) -> bytes:
    return bytes(message.encode(version=version))


def request_bodies() -> dict[tuple[int, int], list[bytes]]:
    """(api key, version) -> valid request bodies (no header), for every API and version the broker serves."""
    out: dict[tuple[int, int], list[bytes]] = {}
    batch = bytes(build_batch([(b"k", b"v")]))
    for api_key in sorted(HANDLERS):
        spec, cls = SPECS[api_key], REQUESTS[api_key]
        for version in range(spec.min_version, spec.max_version + 1):
            bodies = [_encode(api_key, version, cls[version]())]
            try:
                filled = _fill(cls[version]._struct, version)
                if api_key == ApiKey.PRODUCE:
                    td = filled["topic_data"][0]
                    td.partition_data[0].records = batch
                    filled["acks"] = -1
                if api_key == ApiKey.FETCH:
                    filled["max_wait_ms"] = 0
                bodies.append(_encode(api_key, version, cls[version](**filled)))
            except Exception:  # noqa: BLE001 - a schema the filler cannot satisfy keeps its empty seed
                pass
            out[(api_key, version)] = bodies
    return out


def frame(api_key: int, version: int, body: bytes, correlation_id: int = 7, client_id: str = "fuzz") -> bytes:
    """A request without its size prefix: header (v1 or v2, as the API/version needs) plus body."""
    raw = client_id.encode()
    header = (api_key.to_bytes(2, "big") + version.to_bytes(2, "big", signed=True)
              + correlation_id.to_bytes(4, "big", signed=True) + len(raw).to_bytes(2, "big") + raw)
    if request_header_flexible(api_key, version):
        header += b"\x00"
    return header + body


@functools.cache
def record_batches() -> list[bytes]:
    """Valid v2 batches: every codec, keys/headers/null values, idempotent, transactional, a control marker."""
    records = [(b"key", b"value"), (None, b"no key"), (b"k2", None), (b"h", b"with headers", [("hk", b"hv")])]
    out = [bytes(build_batch(records, compression=codec)) for codec in CODECS]
    out.append(bytes(build_batch([(b"k", b"v")] * 3, producer_id=5, producer_epoch=0, base_sequence=0)))
    out.append(bytes(build_batch([(None, b"t")], transactional=True, producer_id=6, producer_epoch=1,
                                 base_sequence=3)))
    out.append(bytes(build_marker(6, 1, True, 0, 1_700_000_000_000)))
    out.append(bytes(build_marker(6, 1, False, 3, 1_700_000_000_000)))
    return out


@functools.cache
def snapshots() -> list[bytes]:
    entries = [
        ProducerEntry(1, 0, -1, 100, 200, -1, deque([CachedBatch(0, 4, 0, 4, 100)])),
        ProducerEntry(2, 3, 1, 100, 200, 17, deque([CachedBatch(i * 5, i * 5 + 4, i * 5, i * 5 + 4, 100)
                                                    for i in range(5)]), 99),
    ]
    return [encode_snapshot([]), encode_snapshot(entries[:1]), encode_snapshot(entries)]


@functools.cache
def txn_log_records() -> tuple[list[bytes], list[bytes]]:
    """(keys, values) of `__transaction_state` records."""
    metas = [
        TransactionMetadata(transactional_id="tx", producer_id=4, producer_epoch=2, last_producer_epoch=1,
                            previous_producer_id=3, timeout_ms=60_000, state=TxnState.ONGOING,
                            partitions={(TOPIC, 0), (TOPIC, 2), ("other", 1)}, start_ms=1, last_update_ms=2),
        TransactionMetadata(transactional_id="tx", producer_id=4, producer_epoch=2, last_producer_epoch=-1,
                            previous_producer_id=-1, timeout_ms=60_000, state=TxnState.EMPTY, partitions=set(),
                            start_ms=-1, last_update_ms=2),
    ]
    return [log_format.encode_key("tx"), log_format.encode_key("")], [log_format.encode_value(m) for m in metas]


@functools.cache
def group_log_records() -> tuple[list[bytes], list[bytes], list[bytes]]:
    """(keys, offset values, group values) of `__consumer_offsets` records."""
    g = group_records
    keys = [g.encode_offset_key("grp", TOPIC, 3), g.encode_group_key("grp")]
    offsets = [g.encode_offset_value(g.OffsetValue(10, 2, "meta", 1_700_000_000_000)),
               g.encode_offset_value(g.OffsetValue(10, -1, "", 5, 6))]
    member = g.MemberValue("m-1", "inst", "client", "/127.0.0.1", 30_000, 10_000, b"sub", b"assign")
    groups = [g.encode_group_value(g.GroupValue("consumer", 3, "range", "m-1", 5, [member])),
              g.encode_group_value(g.GroupValue("consumer", 0, None, None))]
    return keys, offsets, groups
