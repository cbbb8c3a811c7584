"""`produce_batch`'s core (`_Core.append_many`): the same records in the same batches, byte for byte, as
`produce()` of each record in turn — across batch.size and batch.num.messages limits, sticky keyless
partitioning, keys hashed per record, the local queue limit and delivery callbacks."""

from __future__ import annotations

import random
from typing import Any

import pytest

from oncelog.client.errors import KafkaError
from oncelog.client.producer.producer import _Core

TS = 1_700_000_000_000
PARTS = [0, 1, 2]


def _core(**conf: Any) -> _Core:
    base = {"bootstrap.servers": "127.0.0.1:1", "batch.size": 2000, "batch.num.messages": 17}
    base.update(conf)
    core = _Core(base, "caller")  # never started: nothing is sent, batches stay in the accumulator
    core.partitioner._random = random.Random(3)  # the same sticky choices in both producers
    return core


def _batches(core: _Core) -> dict[tuple[str, int], list[tuple[int, bytes, list]]]:
    out = {}
    for tp, queue in core.acc._queues.items():
        out[tp] = []
        for i, batch in enumerate(queue):
            batch.seal(1000 + tp[1], 0, 10 * i)
            out[tp].append((batch.count, bytes(batch.buf), batch.records))
    return out


def _records(rng: random.Random, n: int, keyed: bool, nulls: bool) -> tuple[list, list]:
    keys = [None if not keyed or (nulls and rng.random() < 0.2) else rng.randbytes(rng.randint(0, 30))
            for _ in range(n)]
    values = [None if nulls and rng.random() < 0.1 else rng.randbytes(rng.choice([0, 10, 100, 300, 1900]))
              for _ in range(n)]
    return keys, values


def _each(core: _Core, topic: str, keys, values, partition, callback=None) -> int:
    for i, (k, v) in enumerate(zip(keys, values, strict=True)):
        try:
            core.append(topic, PARTS, v, k, partition, None, TS, callback)
        except BufferError:
            return i
    return len(values)


@pytest.mark.parametrize("keyed", [False, True])
@pytest.mark.parametrize("nulls", [False, True])
@pytest.mark.parametrize("partition", [None, 1])
@pytest.mark.parametrize("partitioner", ["murmur2_random", "random"])
def test_same_batches_as_produce_each(keyed, nulls, partition, partitioner):
    rng = random.Random(hash((keyed, nulls, partition, partitioner)))
    one, many = _core(partitioner=partitioner), _core(partitioner=partitioner)
    for _ in range(8):
        keys, values = _records(rng, rng.randint(1, 60), keyed, nulls)
        assert _each(one, "t", keys, values, partition) == len(values)
        assert many.append_many("t", PARTS, values, keys if keyed else None, partition, TS, None) == len(values)
    got, want = _batches(many), _batches(one)
    assert got == want
    assert sum(c for bs in want.values() for c, _, _ in bs) == many.outstanding == one.outstanding
    assert len([b for bs in want.values() for b in bs]) > 8  # the limits really split runs


def test_local_queue_limit_queues_what_fits():
    one, many = _core(**{"queue.buffering.max.messages": 50}), _core(**{"queue.buffering.max.messages": 50})
    keys, values = _records(random.Random(1), 80, True, False)
    assert _each(one, "t", keys, values, 2) == 50
    assert many.append_many("t", PARTS, values, keys, 2, TS, None) == 50
    assert many.append_many("t", PARTS, values[50:], keys[50:], 2, TS, None) == 0
    assert _batches(many) == _batches(one)


def test_callbacks_keep_every_record():
    calls: list = []
    one, many = _core(), _core()
    keys, values = _records(random.Random(2), 40, True, True)
    _each(one, "t", keys, values, 0, calls.append)
    many.append_many("t", PARTS, values, keys, 0, TS, calls.append)
    got, want = _batches(many), _batches(one)
    assert got == want
    assert [r for _, _, records in got[("t", 0)] for r in records] == \
        [(k, v, None, TS, calls.append) for k, v in zip(keys, values, strict=True)]


def test_strings_are_encoded_and_bad_types_refused():
    one, many = _core(), _core()
    _each(one, "t", ["k1", None], ["v1", bytearray(b"v2")], 0)
    many.append_many("t", PARTS, ["v1", bytearray(b"v2")], ["k1", None], 0, TS, None)
    assert _batches(many) == _batches(one)
    with pytest.raises(TypeError):
        many.append_many("t", PARTS, [1], None, 0, TS, None)
    with pytest.raises(ValueError):
        many.append_many("t", PARTS, [b"a"], [b"k1", b"k2"], 0, TS, None)
    with pytest.raises(KafkaError):
        many.append_many("t", PARTS, [b"a"], None, 3, TS, None)
    assert many.append_many("t", PARTS, [], None, 0, TS, None) == 0
