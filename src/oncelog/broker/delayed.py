"""Delayed operations: long-poll fetches wake when a partition's visible end moves.

A fetch that found fewer than `min_bytes` parks an Event on every partition it asked
for; the flusher (high watermark moved) or a marker write (last stable offset moved)
sets the events of that partition. The fetch then reads again; nothing is polled.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterable

PartitionKey = tuple[str, int]


class PartitionWatchers:
    def __init__(self) -> None:
        self._watchers: dict[PartitionKey, set[asyncio.Event]] = defaultdict(set)
        self._replica_wakes: dict[int, int] = {}

    def watch(self, keys: Iterable[PartitionKey], event: asyncio.Event) -> None:
        for key in keys:
            self._watchers[key].add(event)

    def unwatch(self, keys: Iterable[PartitionKey], event: asyncio.Event) -> None:
        for key in keys:
            events = self._watchers.get(key)
            if events is not None:
                events.discard(event)
                if not events:
                    del self._watchers[key]

    def notify(self, key: PartitionKey) -> None:
        events = self._watchers.get(key)
        if events:
            for event in events:
                event.set()

    def replica_wakes(self, replica_id: int) -> int:
        """How often a follower's parked fetch was asked to answer early (compare before and after a wait)."""
        return self._replica_wakes.get(replica_id, 0)

    def wake_replica(self, replica_id: int) -> None:
        """A parked fetch of follower `replica_id` answers now, with what it has (usually nothing), so that the
        follower's next fetch can include a partition the parked one does not: its first records otherwise wait
        for the long poll's end (replica.fetch.wait.max.ms) before any follower asks for them."""
        self._replica_wakes[replica_id] = self._replica_wakes.get(replica_id, 0) + 1
        self.notify(_replica_key(replica_id))

    def notify_all(self) -> None:
        for events in self._watchers.values():
            for event in events:
                event.set()


def replica_key(replica_id: int) -> PartitionKey:
    """The key a follower's parked fetch also watches (no topic has an empty name)."""
    return _replica_key(replica_id)


def _replica_key(replica_id: int) -> PartitionKey:
    return ("", replica_id)
