"""Replica logs compared on disk after a cluster run: every replica of a partition must hold the same batches at
the same offsets wherever their logs overlap (followers append the leader's batches as they are, so the bytes
match: same base offset, last offset, partition leader epoch and CRC).

The brokers keep running while this reads their segment files (read-only, after the workers stopped and the ISR
is whole again); a batch cut short at the end of the active segment is where a log ends. A divergence is what
truncation by leader epoch exists to prevent: two replicas that would serve different records at one offset.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, NamedTuple

_HEAD = struct.Struct(">qiibIhi")  # base offset, batch length, leader epoch, magic, crc, attributes, last delta
LOG_SUFFIX = ".log"


class Batch(NamedTuple):
    base: int
    last: int
    epoch: int
    crc: int


def batches(partition_dir: Path) -> list[Batch]:
    """The batches of one replica's log, segment after segment, up to the first incomplete one."""
    out: list[Batch] = []
    for segment in sorted(partition_dir.glob(f"*{LOG_SUFFIX}")):
        data = segment.read_bytes()
        pos = 0
        while pos + _HEAD.size <= len(data):
            base, length, epoch, _magic, crc, _attributes, last_delta = _HEAD.unpack_from(data, pos)
            if length <= 0 or pos + 12 + length > len(data):
                break  # preallocated or still being written: the log ends here
            out.append(Batch(base, base + last_delta, epoch, crc))
            pos += 12 + length
    return out


def divergences(replicas: dict[int, Path], limit: int = 3) -> list[dict[str, Any]]:
    """Where the replicas' logs (broker id -> partition directory) disagree on an offset both hold."""
    logs = {node: {b.base: b for b in batches(path)} for node, path in replicas.items() if path.is_dir()}
    found: list[dict[str, Any]] = []
    nodes = sorted(logs)
    for i, a in enumerate(nodes):
        for b in nodes[i + 1:]:
            if not logs[a] or not logs[b]:
                continue
            low = max(min(logs[a]), min(logs[b]))
            high = min(max(x.last for x in logs[a].values()), max(x.last for x in logs[b].values()))
            offsets_a = {o for o in logs[a] if low <= o <= high}
            offsets_b = {o for o in logs[b] if low <= o <= high}
            for offset in sorted(offsets_a | offsets_b):
                mine, theirs = logs[a].get(offset), logs[b].get(offset)
                if mine != theirs:
                    found.append({"brokers": [a, b], "offset": offset, a: mine and mine._asdict(),
                                  b: theirs and theirs._asdict()})
                    if len(found) >= limit:
                        return found
    return found
