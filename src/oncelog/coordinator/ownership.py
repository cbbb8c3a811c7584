"""Which partitions of its internal topic a coordinator serves, and under which leader epoch.

A coordinator serves the groups (or transactional ids) of one partition of `__consumer_offsets`
(`__transaction_state`) only while this broker leads that partition, as Kafka's coordinators do: the broker
tells it when it becomes leader (the coordinator then loads the partition, and requests for its keys get
COORDINATOR_LOAD_IN_PROGRESS until the load is done) and when it stops leading (the partition's state is dropped
and requests get NOT_COORDINATOR, so clients look the coordinator up again). The single node owns every
partition at epoch 0 from startup.

Each load is one `PartitionLoad` object, kept until the partition is unloaded. An operation that waits (for a
write to be replicated, for markers) checks afterwards that the load it began under is still the current one
before it changes anything in memory: a coordinator that lost the partition meanwhile applies nothing, and one
that lost and regained it (a newer load) does not mix the old load's answers into the new state.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass

from ..errors import ErrorCode

# The single node leads every partition at this epoch (broker.partition_access.LOCAL_LEADER_EPOCH).
SINGLE_NODE_EPOCH = 0


@dataclass(eq=False)
class PartitionLoad:
    """One tenure of this coordinator over one partition of its internal topic."""

    partition: int
    leader_epoch: int  # the partition's leader epoch when this broker became its leader; stamps every write
    loaded: bool = False
    task: asyncio.Task | None = None


class Ownership:
    """The partitions a coordinator owns (loading or loaded). Runs on the event loop."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self._loads: dict[int, PartitionLoad] = {}

    def get(self, partition: int) -> PartitionLoad | None:
        return self._loads.get(partition)

    def loaded(self, partition: int) -> PartitionLoad | None:
        """The current load of `partition` if it is complete (the coordinator serves its keys), else None."""
        load = self._loads.get(partition)
        return load if load is not None and load.loaded else None

    def error(self, partition: int) -> ErrorCode:
        """What a request for a key of `partition` is answered before anything else is looked at."""
        load = self._loads.get(partition)
        if load is None:
            return ErrorCode.NOT_COORDINATOR
        return ErrorCode.NONE if load.loaded else ErrorCode.COORDINATOR_LOAD_IN_PROGRESS

    def is_current(self, load: PartitionLoad) -> bool:
        return self._loads.get(load.partition) is load

    def begin(self, partition: int, leader_epoch: int) -> PartitionLoad:
        """A new load; the caller has unloaded any previous one."""
        assert partition not in self._loads, f"{self.topic}-{partition} is loaded already"
        load = self._loads[partition] = PartitionLoad(partition, leader_epoch)
        return load

    def finish(self, load: PartitionLoad) -> bool:
        """Mark `load` complete; False if it was dropped meanwhile (its result must be thrown away)."""
        if not self.is_current(load):
            return False
        load.loaded = True
        load.task = None
        return True

    def drop(self, partition: int) -> PartitionLoad | None:
        """Forget `partition`; a load still running is cancelled."""
        load = self._loads.pop(partition, None)
        if load is not None and load.task is not None and not load.task.done():
            load.task.cancel()
        return load

    @property
    def loading(self) -> bool:
        return any(not load.loaded for load in self._loads.values())

    @property
    def empty(self) -> bool:
        """No partition is owned (loading or loaded)."""
        return not self._loads

    def partitions(self) -> Iterator[int]:
        return iter(sorted(self._loads))

    def tasks(self) -> list[asyncio.Task]:
        return [load.task for load in self._loads.values() if load.task is not None]
