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

    def notify_all(self) -> None:
        for events in self._watchers.values():
            for event in events:
                event.set()
