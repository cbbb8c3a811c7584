"""The broker's view of cluster metadata, built from ZooKeeper by the metadata store's watches.

Every broker holds the whole image (docs/cluster.md §6): live brokers with their epochs, the controller, topics
with their assignments, partition states, topic configs and topics being deleted. The store mutates it only on
the event loop, and only forward: a value older than the one held is ignored, so re-reads that complete late, or
the store applying its own write before the watch reports it, can never move the view backwards. Intermediate
states may be skipped; none is applied out of order.

"Older" is decided per znode by (creation zxid, znode version): ZooKeeper's zxids only grow, so a topic deleted
and created again under the same name (a new znode) is newer than any version of the old one, even though its
version restarts at 0. Listeners get one `ImageDelta` per change, or one per `batch()`.

Pure data: no kazoo, no asyncio.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

NO_LEADER = -1
NO_CONTROLLER = -1


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    """A live broker registration. `epoch` is the czxid of its registration znode (KIP-380's broker epoch)."""

    node_id: int
    host: str          # the inter-broker listener's address: where other brokers connect
    port: int
    rack: str | None
    epoch: int
    # Every listener's advertised address, (name, host, port), as Kafka's broker znode lists its endpoints; empty
    # for a registration that named none (one listener: host and port).
    endpoints: tuple[tuple[str, str, int], ...] = ()

    def endpoint(self, listener: str | None) -> tuple[str, int] | None:
        """host:port of this broker on the listener named `listener` (a client's), None when it has none; the
        inter-broker address when no listener is named or the registration lists no endpoints."""
        if listener is None or not self.endpoints:
            return self.host, self.port
        for name, host, port in self.endpoints:
            if name == listener:
                return host, port
        return None


@dataclass(frozen=True, slots=True)
class PartitionState:
    """The state znode of one partition. `version` is the znode version: the partition epoch and CAS token."""

    leader: int                 # NO_LEADER (-1) = offline
    leader_epoch: int
    isr: tuple[int, ...]
    controller_epoch: int       # epoch of the controller that last elected
    version: int
    log_start_floor: int = 0    # highest log start offset the ISR has persisted, as last written (informational)

    @property
    def online(self) -> bool:
        return self.leader != NO_LEADER


@dataclass(frozen=True, slots=True)
class PartitionAssignment:
    """A partition's replicas; during a reassignment (KIP-455) `replicas` is target + removing."""

    replicas: tuple[int, ...]
    adding: tuple[int, ...] = ()
    removing: tuple[int, ...] = ()

    @property
    def reassigning(self) -> bool:
        return bool(self.adding or self.removing)

    @property
    def target(self) -> tuple[int, ...]:
        """The replicas once the reassignment completes."""
        return tuple(r for r in self.replicas if r not in self.removing)

    @property
    def original(self) -> tuple[int, ...]:
        """The replicas before the reassignment began (what a cancellation returns to)."""
        return tuple(r for r in self.replicas if r not in self.adding)


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """A topic znode. `created` is its czxid, which tells a re-created topic of the same name from the old one."""

    name: str
    topic_id: bytes                                 # 16 bytes (uuid4)
    assignment: dict[int, PartitionAssignment]
    version: int                                    # topic znode version
    created: int = 0

    @property
    def partition_count(self) -> int:
        return len(self.assignment)

    @property
    def replication_factor(self) -> int:
        first = self.assignment.get(0)
        return len(first.target) if first is not None else 0


@dataclass(frozen=True, slots=True)
class TopicDeletion:
    """/deleting/<topic>: per deleted incarnation (topic id), the brokers whose copy is not yet deleted."""

    name: str
    pending: dict[bytes, tuple[int, ...]]
    version: int
    created: int = 0


@dataclass
class ImageDelta:
    """What one change (or one batch of changes) touched."""

    brokers_changed: bool = False
    brokers_added: set[int] = field(default_factory=set)      # new registrations (a new epoch counts)
    brokers_removed: set[int] = field(default_factory=set)
    partitions: set[tuple[str, int]] = field(default_factory=set)  # state or assignment changed
    topics_added: set[str] = field(default_factory=set)
    topics_removed: set[str] = field(default_factory=set)
    configs: set[str] = field(default_factory=set)
    deletions: set[str] = field(default_factory=set)
    controller_changed: bool = False

    def __bool__(self) -> bool:
        return bool(self.brokers_changed or self.partitions or self.topics_added or self.topics_removed
                    or self.configs or self.deletions or self.controller_changed)

    def merge(self, other: ImageDelta) -> None:
        self.brokers_changed |= other.brokers_changed
        self.brokers_added |= other.brokers_added
        self.brokers_removed |= other.brokers_removed
        self.partitions |= other.partitions
        self.topics_added |= other.topics_added
        self.topics_removed |= other.topics_removed
        self.configs |= other.configs
        self.deletions |= other.deletions
        self.controller_changed |= other.controller_changed


Listener = Callable[[ImageDelta], None]


class MetadataImage:
    """The watch-driven view of ZooKeeper. Mutated only on the event loop, by the metadata store."""

    def __init__(self) -> None:
        self.cluster_id: str = ""
        self.brokers: dict[int, BrokerInfo] = {}
        self.controller_id: int = NO_CONTROLLER
        self.controller_epoch: int = 0
        self.topics: dict[str, TopicInfo] = {}
        self.states: dict[tuple[str, int], PartitionState] = {}
        self.topic_configs: dict[str, dict[str, str]] = {}
        self.deleting: dict[str, TopicDeletion] = {}
        self._state_created: dict[tuple[str, int], int] = {}
        self._config_version: dict[str, tuple[int, int]] = {}
        self._listeners: list[Listener] = []
        self._pending: ImageDelta | None = None
        self._batch_depth = 0

    # ---- listeners -------------------------------------------------------------------------------------------

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def unsubscribe(self, listener: Listener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Collect the changes made inside into one delta, delivered at the end (a full read is one event)."""
        if self._batch_depth == 0:
            self._pending = ImageDelta()
        self._batch_depth += 1
        try:
            yield
        finally:
            self._batch_depth -= 1
            if self._batch_depth == 0:
                delta, self._pending = self._pending, None
                if delta:
                    self._deliver(delta)

    def _emit(self, delta: ImageDelta) -> None:
        if self._pending is not None:
            self._pending.merge(delta)
        else:
            self._deliver(delta)

    def _deliver(self, delta: ImageDelta) -> None:
        for listener in list(self._listeners):
            try:
                listener(delta)
            except Exception:
                log.exception("metadata image listener %r failed", listener)

    # ---- apply: every method returns whether anything changed and ignores anything older than what is held ---

    def apply_cluster_id(self, cluster_id: str) -> bool:
        if cluster_id == self.cluster_id:
            return False
        self.cluster_id = cluster_id
        return True

    def apply_broker(self, info: BrokerInfo) -> bool:
        held = self.brokers.get(info.node_id)
        if held is not None and (held.epoch > info.epoch or held == info):
            return False
        self.brokers[info.node_id] = info
        self._emit(ImageDelta(brokers_changed=True, brokers_added={info.node_id}
                              if held is None or held.epoch != info.epoch else set()))
        return True

    def remove_broker(self, node_id: int, epoch: int | None = None) -> bool:
        """Drop a registration; with `epoch`, only one at most that old (a newer incarnation stays)."""
        held = self.brokers.get(node_id)
        if held is None or (epoch is not None and held.epoch > epoch):
            return False
        del self.brokers[node_id]
        self._emit(ImageDelta(brokers_changed=True, brokers_removed={node_id}))
        return True

    def apply_brokers(self, brokers: Iterable[BrokerInfo]) -> bool:
        """Make the registrations exactly `brokers` (a full read of /brokers/ids)."""
        fresh = {b.node_id: b for b in brokers}
        changed = False
        with self.batch():
            for node_id in [n for n in self.brokers if n not in fresh]:
                changed |= self.remove_broker(node_id)
            for info in fresh.values():
                changed |= self.apply_broker(info)
        return changed

    def apply_controller(self, controller_id: int, controller_epoch: int) -> bool:
        """The holder of /controller (NO_CONTROLLER when absent) and its epoch; an older epoch is ignored."""
        if controller_epoch < self.controller_epoch:
            return False
        if (controller_id, controller_epoch) == (self.controller_id, self.controller_epoch):
            return False
        self.controller_id, self.controller_epoch = controller_id, controller_epoch
        self._emit(ImageDelta(controller_changed=True))
        return True

    def apply_topic(self, info: TopicInfo) -> bool:
        held = self.topics.get(info.name)
        if held is not None:
            if (held.created, held.version) > (info.created, info.version):
                return False
            if held == info:
                return False
        delta = ImageDelta()
        if held is not None and held.created != info.created:
            # A new incarnation under the same name: the old one's states and configs are gone with it.
            self._drop_topic(held.name, delta)
            held = None
        self.topics[info.name] = info
        if held is None:
            delta.topics_added.add(info.name)
            delta.partitions.update((info.name, p) for p in info.assignment)
        else:
            delta.partitions.update((info.name, p) for p, a in info.assignment.items()
                                    if held.assignment.get(p) != a)
        self._emit(delta)
        return True

    def remove_topic(self, name: str, created: int | None = None) -> bool:
        """Drop a topic with its states and configs; with `created`, only that incarnation or an older one."""
        held = self.topics.get(name)
        if held is None or (created is not None and held.created > created):
            return False
        delta = ImageDelta()
        self._drop_topic(name, delta)
        self._emit(delta)
        return True

    def _drop_topic(self, name: str, delta: ImageDelta) -> None:
        info = self.topics.pop(name)
        for p in info.assignment:
            self.states.pop((name, p), None)
            self._state_created.pop((name, p), None)
            delta.partitions.add((name, p))
        if self.topic_configs.pop(name, None) is not None:
            delta.configs.add(name)
        self._config_version.pop(name, None)
        delta.topics_removed.add(name)

    def apply_partition_state(self, topic: str, partition: int, state: PartitionState, created: int = 0) -> bool:
        """A state znode read; ignored for a topic or partition the image does not hold (read it first)."""
        info = self.topics.get(topic)
        if info is None or partition not in info.assignment:
            return False
        key = (topic, partition)
        held = self.states.get(key)
        if held is not None:
            held_created = self._state_created.get(key, 0)
            if (held_created, held.version) > (created, state.version) or held == state:
                return False
        self.states[key] = state
        self._state_created[key] = created
        self._emit(ImageDelta(partitions={key}))
        return True

    def apply_topic_configs(self, topic: str, configs: Mapping[str, str], version: int, created: int = 0) -> bool:
        """A config znode read. A newer version is reported even when it holds the same overrides (a write that
        deleted a key nobody had set): config_version() moved, and an admin request waiting for the image to show
        a config write (IncrementalAlterConfigs through a broker that is not the controller) waits for that."""
        if topic not in self.topics:
            return False
        held = self._config_version.get(topic)
        if held is not None and held > (created, version):
            return False
        newer = held is None or (created, version) > held
        self._config_version[topic] = (created, version)
        fresh = dict(configs)
        if self.topic_configs.get(topic) == fresh and not newer:
            return False
        self.topic_configs[topic] = fresh
        self._emit(ImageDelta(configs={topic}))
        return True

    def apply_deletion(self, deletion: TopicDeletion) -> bool:
        held = self.deleting.get(deletion.name)
        if held is not None and ((held.created, held.version) > (deletion.created, deletion.version)
                                 or held == deletion):
            return False
        self.deleting[deletion.name] = deletion
        self._emit(ImageDelta(deletions={deletion.name}))
        return True

    def remove_deletion(self, name: str, created: int | None = None) -> bool:
        held = self.deleting.get(name)
        if held is None or (created is not None and held.created > created):
            return False
        del self.deleting[name]
        self._emit(ImageDelta(deletions={name}))
        return True

    def retain_topics(self, names: Iterable[str]) -> bool:
        """Drop every topic not in `names` (a read of /topics' children)."""
        keep = set(names)
        changed = False
        with self.batch():
            for name in [n for n in self.topics if n not in keep]:
                changed |= self.remove_topic(name)
        return changed

    def retain_deletions(self, names: Iterable[str]) -> bool:
        keep = set(names)
        changed = False
        with self.batch():
            for name in [n for n in self.deleting if n not in keep]:
                changed |= self.remove_deletion(name)
        return changed

    # ---- queries ---------------------------------------------------------------------------------------------

    def partition(self, topic: str, partition: int) -> PartitionState | None:
        return self.states.get((topic, partition))

    def assignment(self, topic: str, partition: int) -> PartitionAssignment | None:
        info = self.topics.get(topic)
        return None if info is None else info.assignment.get(partition)

    def config_version(self, topic: str) -> int | None:
        """The version of the topic's config znode as held (the CAS token of a config write)."""
        held = self._config_version.get(topic)
        return None if held is None else held[1]

    def is_live(self, node_id: int) -> bool:
        return node_id in self.brokers

    def broker_epoch(self, node_id: int) -> int | None:
        info = self.brokers.get(node_id)
        return None if info is None else info.epoch

    def replicas_on(self, node_id: int) -> list[tuple[str, int]]:
        """Every partition with a replica on `node_id` (reassignment targets included)."""
        return [(t, p) for t, info in self.topics.items() for p, a in info.assignment.items() if node_id in a.replicas]

    def led_by(self, node_id: int) -> list[tuple[str, int]]:
        return [key for key, state in self.states.items() if state.leader == node_id]

    def all_partitions(self) -> Iterator[tuple[str, int, PartitionAssignment, PartitionState | None]]:
        for name, info in self.topics.items():
            for p, a in sorted(info.assignment.items()):
                yield name, p, a, self.states.get((name, p))
