"""`encode_records` / `BatchBuilder.append_many`: a run of records encoded at once is byte for byte what
appending them one by one gives, whatever the lengths, nulls, offsets and timestamps."""

from __future__ import annotations

import random

import pytest
from aiokafka.record.default_records import DefaultRecordBatch as AioBatch

from oncelog.records.builder import BatchBuilder, encode_record, encode_records
from oncelog.records.reader import read_batches


def _random_records(rng: random.Random, n: int, nulls: bool, big: bool) -> tuple[list, list]:
    def blob() -> bytes | None:
        if nulls and rng.random() < 0.1:
            return None
        size = rng.choice([0, 1, 63, 64, 100, 8191, 8192]) if not big else rng.choice([0, 5, 40_000])
        return rng.randbytes(size)
    return [blob() for _ in range(n)], [blob() for _ in range(n)]


@pytest.mark.parametrize("nulls", [False, True])
@pytest.mark.parametrize("big", [False, True])
@pytest.mark.parametrize("first, delta", [(0, 0), (5, 17), (32_760, 3), (100_000, -70), (0, 1 << 40)])
def test_encode_records_equals_encode_record_each(nulls, big, first, delta):
    rng = random.Random(hash((nulls, big, first, delta)))
    keys, values = _random_records(rng, 40, nulls, big)
    want = b"".join(encode_record(first + i, delta, k, v, ())
                    for i, (k, v) in enumerate(zip(keys, values, strict=True)))
    assert encode_records(first, delta, keys, values) == want
    want_keyless = b"".join(encode_record(first + i, delta, None, v, ()) for i, v in enumerate(values))
    assert encode_records(first, delta, None, values) == want_keyless
    assert encode_records(first, delta, [None] * len(values), values) == want_keyless


def test_encode_records_edge_cases():
    assert encode_records(0, 0, None, []) == b""
    with pytest.raises(ValueError):
        encode_records(0, 0, [b"k"], [b"a", b"b"])
    with pytest.raises(TypeError):
        encode_records(0, 0, None, ["text, not bytes"])
    # bytearray and memoryview are bytes-like for the encoder too
    assert encode_records(3, 1, [bytearray(b"k")], [memoryview(b"v")]) == encode_record(3, 1, b"k", b"v", ())


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])
def test_append_many_builds_the_same_batch_as_append(codec):
    """Runs after single appends, runs with their own timestamps (earlier, later): the same finished batch."""
    rng = random.Random(codec)
    steps = []
    ts = 1_700_000_000_000
    for _ in range(12):
        keys, values = _random_records(rng, rng.randint(1, 30), True, False)
        steps.append((rng.random() < 0.3, keys, values, ts + rng.randint(-50, 50)))
    one, many = BatchBuilder(codec, transactional=True), BatchBuilder(codec, transactional=True)
    for single, keys, values, when in steps:
        for k, v in zip(keys, values, strict=True):
            one.append(k, v, (), when)
        if single:
            for k, v in zip(keys, values, strict=True):
                many.append(k, v, (), when)
        else:
            assert many.append_many(keys, values, when) == one.record_count - len(values)
    assert many.record_count == one.record_count
    ident = {"producer_id": 7, "producer_epoch": 2, "base_sequence": 40}
    built = many.build(**ident)
    assert built == one.build(**ident)
    # and an independent reader (aiokafka's Cython parser) reads every record back
    batch = AioBatch(bytes(built))
    assert batch.validate_crc()
    read = [(r.key, r.value, r.timestamp) for r in batch]
    assert read == [(k, v, w) for _, keys, values, w in steps for k, v in zip(keys, values, strict=True)]
    assert [r.value for r in next(iter(read_batches(built))).records] == [v for *_, values, _ in steps
                                                                           for v in values]


def test_append_many_empty_run_changes_nothing():
    builder = BatchBuilder()
    assert builder.append_many(None, [], 5) == 0
    assert builder.record_count == 0
    builder.append(b"k", b"v", (), 10)
    assert builder.append_many([], [], 99) == 1
    alone = BatchBuilder()
    alone.append(b"k", b"v", (), 10)
    assert builder.build() == alone.build()
