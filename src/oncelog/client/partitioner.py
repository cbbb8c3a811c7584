"""Which partition a record goes to: the Java client's default partitioner, byte for byte.

Keyed records go to `toPositive(murmur2(key)) % partitions`, so a key lands on the same partition whichever
client wrote it (Java, librdkafka's `murmur2_random`, this one) and per-key order holds across a mixed fleet.
Keyless records stick to one partition until its batch closes (KIP-480's sticky partitioning): whole batches
instead of one record per partition per request, which is where the throughput is.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Sequence

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF

PARTITIONERS = ("murmur2_random", "murmur2", "random")


def murmur2(data: bytes | bytearray | memoryview) -> int:
    """Kafka's `Utils.murmur2`: MurmurHash2 with Kafka's seed, as a signed 32-bit int like Java returns it."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    whole = length >> 2
    if whole:
        for k in struct.unpack_from(f"<{whole}I", data):
            k = (k * _M) & _MASK
            k ^= k >> 24
            k = (k * _M) & _MASK
            h = ((h * _M) & _MASK) ^ k
    tail = length & 3
    if tail:
        base = length & ~3
        if tail == 3:
            h ^= data[base + 2] << 16
        if tail >= 2:
            h ^= data[base + 1] << 8
        h ^= data[base]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_key(key: bytes | bytearray | memoryview, num_partitions: int) -> int:
    """Java's `BuiltInPartitioner.partitionForKey`: `toPositive` masks the sign bit, it does not negate."""
    return (murmur2(key) & 0x7FFFFFFF) % num_partitions


class Partitioner:
    """Chooses partitions for records without an explicit one; one instance per producer.

    `murmur2_random` (the default, Java's and librdkafka's name): murmur2 for keys, sticky for keyless.
    `murmur2`: keyless records are sticky too (there is no hash to take). `random`: ignores keys.
    Callers hold the accumulator's lock, so the sticky choice needs no lock of its own.
    """

    __slots__ = ("_kind", "_sticky", "_random")

    def __init__(self, kind: str = "murmur2_random", rng: random.Random | None = None) -> None:
        if kind not in PARTITIONERS:
            raise ValueError(f"partitioner must be one of {', '.join(PARTITIONERS)}, not {kind!r}")
        self._kind = kind
        self._sticky: dict[str, int] = {}
        self._random = rng or random.Random()

    @property
    def hashes_keys(self) -> bool:
        """Whether a keyed record's partition comes from its key (else keyed records are sticky too)."""
        return self._kind != "random"

    def partition(self, topic: str, key: bytes | None, partitions: Sequence[int]) -> int:
        """The partition of one record; `partitions` is the topic's partition ids (not empty)."""
        if key is not None and self._kind != "random":
            # Java hashes over every partition of the topic, available or not: ids are 0..n-1
            return partition_for_key(key, len(partitions))
        current = self._sticky.get(topic)
        if current is None or current not in partitions:
            current = self._pick(partitions, None)
            self._sticky[topic] = current
        return current

    def batch_closed(self, topic: str, partition: int, partitions: Sequence[int]) -> None:
        """The batch the sticky partition was filling is closed: keyless records move to another partition."""
        if self._sticky.get(topic) == partition:
            self._sticky[topic] = self._pick(partitions, partition)

    def _pick(self, partitions: Sequence[int], previous: int | None) -> int:
        if len(partitions) == 1:
            return partitions[0]
        while True:
            choice = partitions[self._random.randrange(len(partitions))]
            if choice != previous:
                return choice

