"""Key -> latest offset over a dirty range, bounded the way Kafka bounds its cleaner's map.

`log.cleaner.dedupe.buffer.size` is a memory budget in Kafka: 24 bytes an entry (a 16-byte MD5 digest of the key
and an 8-byte offset), filled to `log.cleaner.io.buffer.load.factor` (0.9). The same count bounds this map, so
a user's setting means the same number of keys per round here. Keys of 16 bytes or more are kept as 16-byte
BLAKE2b digests, shorter ones as they are: memory per entry stays bounded whatever the key size, and a collision (2^-64 for a billion keys) would only keep an
old record, never drop a newest one, as in Kafka.
"""

from __future__ import annotations

from hashlib import blake2b

BYTES_PER_ENTRY = 24
LOAD_FACTOR = 0.9


def digest(key: bytes) -> bytes:
    """The map's key for `key`: the key itself when shorter than a digest (no hashing for the short keys most
    topics have, and no collision: a digest is always 16 bytes), else its 16-byte BLAKE2b digest."""
    if len(key) < 16:
        return key
    return blake2b(key, digest_size=16).digest()


class OffsetMap:
    """The newest offset of each key seen, in offset order, for at most `capacity` keys."""

    __slots__ = ("capacity", "_map", "latest_offset")

    def __init__(self, buffer_bytes: int, load_factor: float = LOAD_FACTOR) -> None:
        self.capacity = max(1, int(buffer_bytes // BYTES_PER_ENTRY * load_factor))
        self._map: dict[bytes, int] = {}
        self.latest_offset = -1  # the highest offset put: a round cleans up to latest_offset + 1

    def __len__(self) -> int:
        return len(self._map)

    def has_room_for(self, records: int) -> bool:
        """Whether a batch of `records` records surely fits: a round takes whole batches, never part of one."""
        return len(self._map) + records <= self.capacity

    def put(self, key: bytes, offset: int) -> None:
        """Record `key` at `offset`; offsets come in increasing order (the caller checked `has_room_for`)."""
        self._map[digest(key)] = offset
        self.latest_offset = offset

    def get(self, key: bytes) -> int | None:
        return self._map.get(digest(key))
