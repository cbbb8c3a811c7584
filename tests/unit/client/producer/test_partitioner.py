"""The default partitioner: murmur2 exactly as the Java client computes it, sticky for keyless records."""

from __future__ import annotations

import random

import pytest

from oncelog.client.partitioner import Partitioner, murmur2, partition_for_key

# Kafka's own vectors (clients/src/test/.../utils/UtilsTest.java, testMurmur2), plus the empty key.
JAVA_VECTORS = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
    (b"", 275646681),
]


@pytest.mark.parametrize("data,expected", JAVA_VECTORS)
def test_murmur2_matches_the_java_client(data, expected):
    assert murmur2(data) == expected
    assert murmur2(bytearray(data)) == expected
    assert murmur2(memoryview(data)) == expected


def test_partition_masks_the_sign_bit_like_to_positive():
    # toPositive(-790332482) = -790332482 & 0x7fffffff = 1357151166; Java's Math.abs would give 790332482
    assert partition_for_key(b"foobar", 50) == 1357151166 % 50 == 16
    assert partition_for_key(b"21", 7) == (-973932308 & 0x7FFFFFFF) % 7


def test_every_tail_length_is_covered():
    # lengths 0..8 exercise the 0-3 trailing byte branches twice; the values must be stable and distinct
    hashes = [murmur2(b"x" * n) for n in range(9)]
    assert len(set(hashes)) == 9
    assert all(-(2**31) <= h < 2**31 for h in hashes)


def test_keyed_records_ignore_the_sticky_choice():
    p = Partitioner("murmur2_random", random.Random(1))
    parts = list(range(12))
    assert {p.partition("t", b"foobar", parts) for _ in range(20)} == {partition_for_key(b"foobar", 12)}


def test_keyless_records_stick_until_the_batch_closes():
    p = Partitioner("murmur2_random", random.Random(7))
    parts = list(range(6))
    first = p.partition("t", None, parts)
    assert all(p.partition("t", None, parts) == first for _ in range(100))
    p.batch_closed("t", first, parts)
    second = p.partition("t", None, parts)
    assert second != first
    p.batch_closed("t", first, parts)  # a closed batch of another partition does not move the sticky one
    assert p.partition("t", None, parts) == second
    seen = set()
    for _ in range(200):
        current = p.partition("t", None, parts)
        seen.add(current)
        p.batch_closed("t", current, parts)
    assert seen == set(parts)


def test_random_partitioner_ignores_keys_and_single_partition_topics_work():
    p = Partitioner("random", random.Random(3))
    assert p.partition("one", b"k", [0]) == 0
    p.batch_closed("one", 0, [0])
    assert p.partition("one", None, [0]) == 0
    with pytest.raises(ValueError):
        Partitioner("consistent")
