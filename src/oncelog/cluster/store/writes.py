"""The controller's and the partition leaders' writes (docs/metadata-store.md, (e)): topics (created at once, or in
steps when too big for one request), creations a controller left unfinished, partition states, assignments,
deletion and its completion, topic configs, producer-id blocks.

Every controller write is one multi-op behind the controller's epoch check (`commit`, ControllerSeat.commit given
by the facade), and a compare-and-set on the znode versions it read: all of it is written or none. What a write
changed is applied to the image at once, from the versions ZooKeeper answered; what it cannot know (a creation's
states, a deletion's znode) is re-read through the loader's reads the facade gives (`read_topic`, `read_state`,
`read_deletion`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, NotEmptyError

from ..metadata_image import MetadataImage, PartitionAssignment, PartitionState, TopicInfo
from . import znodes
from .errors import RequestTooLarge, StaleVersion, TopicExists, UnknownTopic
from .session import CheckedCommit, StoreSession
from .znodes import DELETING, PRODUCER_ID_BLOCK, TOPIC_CONFIGS, state_path, topic_path


def creation_batch(base: str, limit: int) -> int:
    """Partitions per multi-op of a creation in steps under the topic znode `base`: two creates per partition
    (paths, a state of at most ~200 bytes, headers and ACLs), within half of `limit` for margin."""
    return max(1, limit // 2 // (2 * (len(base) + 96) + 200))


def deletion_batch(base: str, limit: int) -> int:
    """Partitions per multi-op of a deletion in steps under `base` (the topic's /partitions znode): two deletes
    (paths and versions) per partition."""
    return max(1, limit // (4 * (len(base) + 32)))


class MetadataWrites:
    """The writes of a controller (behind its epoch) and of a partition leader (its ISR), applied to the image."""

    def __init__(
        self,
        session: StoreSession,
        image: MetadataImage,
        commit: CheckedCommit,
        pending_creations: set[str],
        *,
        read_topic: Callable[..., Awaitable[TopicInfo | None]],
        read_state: Callable[[str, int], Awaitable[None]],
        read_deletion: Callable[[str], Awaitable[None]],
    ) -> None:
        self.session = session
        self.image = image
        self._commit = commit
        self._call, self._kz, self._p = session.call, session.kz, session.path
        # Topics whose znode says `creating`: the loader adds those it reads, a creation in steps its own, and
        # abandon_creations removes them (the same set, the facade's).
        self.pending_creations = pending_creations
        self._read_topic = read_topic
        self._read_state = read_state
        self._read_deletion = read_deletion

    async def create_topic(
        self,
        name: str,
        topic_id: bytes,
        assignment: Mapping[int, Sequence[int]],
        configs: Mapping[str, str],
        controller_epoch: int,
        initial: Mapping[int, tuple[int, Sequence[int]]] | None = None,
    ) -> TopicInfo:
        """One multi-op: the controller-epoch check, the topic znode, every partition's state znode (leader =
        first replica, epoch 0, ISR = all replicas, unless `initial` gives {partition: (leader, isr)}) and the
        config znode. Raises TopicExists. Returns the topic as the image now holds it."""
        self.session.require_connected()
        parts = {p: PartitionAssignment(tuple(r)) for p, r in sorted(assignment.items())}

        def build(txn: Any) -> None:
            txn.create(self._p(topic_path(name)), znodes.topic_json(topic_id, parts))
            txn.create(self._p(f"{topic_path(name)}/partitions"), b"")
            for p, a in parts.items():
                leader, isr = (initial or {}).get(p, (a.replicas[0], a.replicas))
                txn.create(self._p(f"{topic_path(name)}/partitions/{p}"), b"")
                txn.create(self._p(state_path(name, p)),
                           znodes.state_json(PartitionState(leader, 0, tuple(isr), controller_epoch, 0)))
            txn.create(self._p(f"{TOPIC_CONFIGS}/{name}"), znodes.dump({"config": dict(configs)}))

        try:
            try:
                await self._commit(build, controller_epoch)
            except RequestTooLarge:
                await self._create_in_steps(name, topic_id, parts, configs, controller_epoch, initial)
        except NodeExistsError as exc:
            raise TopicExists(f"Topic '{name}' already exists.") from exc
        info = await self._read_topic(name, full=True)
        if info is None:
            raise UnknownTopic(f"topic {name} vanished right after its creation")
        return info

    async def _create_in_steps(self, name: str, topic_id: bytes, parts: Mapping[int, PartitionAssignment],
                               configs: Mapping[str, str], controller_epoch: int,
                               initial: Mapping[int, tuple[int, Sequence[int]]] | None) -> None:
        """A topic too big for one ZooKeeper request (jute.maxbuffer): its znode first, marked `creating` (every
        image ignores it), then its partitions' znodes a batch per multi-op, then, atomically, the mark cleared
        and the config written: the topic appears whole or not at all. Every step carries the controller-epoch
        check; a creation a controller left unfinished is removed by the next one (`abandon_creations`)."""
        base = self._p(topic_path(name))

        def first(txn: Any) -> None:
            txn.create(base, znodes.topic_json(topic_id, parts, creating=True))
            txn.create(f"{base}/partitions", b"")

        await self._commit(first, controller_epoch)
        try:
            await self._create_partitions_then_reveal(name, topic_id, parts, configs, controller_epoch, initial)
        except BaseException:
            with contextlib.suppress(Exception):     # best effort; else the next controller removes it
                self.pending_creations.add(name)
                await self.abandon_creations(controller_epoch, only=name)
            raise

    async def _create_partitions_then_reveal(self, name: str, topic_id: bytes,
                                             parts: Mapping[int, PartitionAssignment], configs: Mapping[str, str],
                                             controller_epoch: int,
                                             initial: Mapping[int, tuple[int, Sequence[int]]] | None) -> None:
        base = self._p(topic_path(name))
        items = sorted(parts.items())
        batch = creation_batch(base, self.session.max_multi_bytes())
        for i in range(0, len(items), batch):
            def states(txn: Any, chunk: Sequence[tuple[int, PartitionAssignment]] = items[i:i + batch]) -> None:
                for p, a in chunk:
                    leader, isr = (initial or {}).get(p, (a.replicas[0], a.replicas))
                    txn.create(f"{base}/partitions/{p}", b"")
                    txn.create(f"{base}/partitions/{p}/state",
                               znodes.state_json(PartitionState(leader, 0, tuple(isr), controller_epoch, 0)))

            await self._commit(states, controller_epoch)

        def finish(txn: Any) -> None:
            txn.set_data(base, znodes.topic_json(topic_id, parts), version=0)
            txn.create(self._p(f"{TOPIC_CONFIGS}/{name}"), znodes.dump({"config": dict(configs)}))

        await self._commit(finish, controller_epoch)

    async def abandon_creations(self, controller_epoch: int, only: str | None = None) -> list[str]:
        """A new controller removes the topics a previous one began to create in steps and did not finish (never
        visible to anyone); their CreateTopics got no success answer, and a retry creates them anew. `only`: the
        creation this controller just failed to finish."""
        gone = []
        for name in sorted(self.pending_creations if only is None else {only}):
            base = self._p(topic_path(name))
            try:
                data, stat = await self._call(self._kz().get_async(base))
            except NoNodeError:
                self.pending_creations.discard(name)
                continue
            if not znodes.creating(data):
                continue
            await self._delete_partition_znodes(name, controller_epoch)
            try:
                await self._commit(lambda txn, b=base, v=stat.version: (txn.delete(f"{b}/partitions"),
                                                                         txn.delete(b, version=v)),
                                   controller_epoch)
            except (NoNodeError, BadVersionError, NotEmptyError):
                continue                  # changed meanwhile: looked at again by the next controller
            self.pending_creations.discard(name)
            gone.append(name)
        return gone

    async def write_partition_states(self, changes: Sequence[tuple[str, int, PartitionState, int]],
                                     controller_epoch: int) -> None:
        """The controller's CAS of many partition states at once, (topic, partition, new state, expected version)
        each, in one multi-op behind its epoch check: all are written or none (StaleVersion when any of them
        moved since it was read; the caller then decides those one by one). One ZooKeeper transaction, so one
        fsync on the ensemble, instead of one per partition: moving the leaderships of thousands of partitions
        after a broker's death takes a few round trips. Applies the states to the image."""
        self.session.require_connected()
        stamped = [(t, p, PartitionState(s.leader, s.leader_epoch, s.isr, controller_epoch, s.version,
                                         s.log_start_floor), v) for t, p, s, v in changes]

        def build(txn: Any) -> None:
            for topic, partition, state, version in stamped:
                txn.set_data(self._p(state_path(topic, partition)), znodes.state_json(state), version=version)

        try:
            results = await self._commit(build, controller_epoch)
        except (BadVersionError, NoNodeError) as exc:
            raise StaleVersion(f"one of {len(changes)} partition states moved") from exc
        stats = results[1:]
        with self.image.batch():
            for (topic, partition, state, _), stat in zip(stamped, stats, strict=True):
                self.image.apply_partition_state(topic, partition, _replace_version(state, stat.version),
                                                 stat.czxid)

    async def write_partition_state(self, topic: str, partition: int, new: PartitionState, expected_version: int,
                                    controller_epoch: int | None) -> int:
        """CAS of a partition's state on `expected_version`. The controller passes its epoch (checked in the same
        multi-op, and written into the state); a leader's ISR write passes None. Returns the new version and
        applies the state to the image. Raises StaleVersion or NotController."""
        self.session.require_connected()
        path = self._p(state_path(topic, partition))
        if controller_epoch is not None:
            new = PartitionState(new.leader, new.leader_epoch, new.isr, controller_epoch, new.version,
                                 new.log_start_floor)
        try:
            results = await self._commit(
                lambda txn: txn.set_data(path, znodes.state_json(new), version=expected_version), controller_epoch)
        except (BadVersionError, NoNodeError) as exc:
            raise StaleVersion(f"{topic}-{partition} state is no longer at version {expected_version}") from exc
        stat = results[-1]
        self.image.apply_partition_state(topic, partition, _replace_version(new, stat.version), stat.czxid)
        return stat.version

    async def write_assignment(
        self,
        topic: str,
        assignment: Mapping[int, PartitionAssignment | Sequence[int]],
        expected_version: int,
        controller_epoch: int,
        *,
        new_partitions: Mapping[int, PartitionState] | None = None,
        states: Mapping[int, tuple[PartitionState, int]] | None = None,
    ) -> int:
        """CAS of the topic znode (its whole assignment, with adding/removing), in one multi-op with the creation of
        `new_partitions` (CreatePartitions) and CASes of `states` {partition: (state, expected version)} (the end
        of a reassignment). Returns the topic znode's new version. Raises StaleVersion / NotController."""
        self.session.require_connected()
        held = self.image.topics.get(topic)
        if held is None:
            raise UnknownTopic(topic)
        parts = {p: znodes.as_assignment(a) for p, a in assignment.items()}
        new_partitions = dict(new_partitions or {})
        states = dict(states or {})
        if not set(new_partitions) <= set(parts) - set(held.assignment):
            raise ValueError(f"new partitions {sorted(new_partitions)} of {topic} must be in the assignment and new")

        def build(txn: Any) -> None:
            txn.set_data(self._p(topic_path(topic)), znodes.topic_json(held.topic_id, parts), version=expected_version)
            for p, state in sorted(new_partitions.items()):
                txn.create(self._p(f"{topic_path(topic)}/partitions/{p}"), b"")
                txn.create(self._p(state_path(topic, p)),
                           znodes.state_json(_with_epoch(state, controller_epoch)))
            for p, (state, version) in sorted(states.items()):
                txn.set_data(self._p(state_path(topic, p)),
                             znodes.state_json(_with_epoch(state, controller_epoch)), version=version)

        try:
            results = await self._commit(build, controller_epoch)
        except (BadVersionError, NoNodeError, NodeExistsError) as exc:
            raise StaleVersion(f"topic {topic} changed since version {expected_version}") from exc
        stat = results[1]
        self.image.apply_topic(TopicInfo(topic, held.topic_id, parts, stat.version, stat.czxid))
        offset = 2 + 2 * len(new_partitions)
        for i, (p, (state, _)) in enumerate(sorted(states.items())):
            s = results[offset + i]
            self.image.apply_partition_state(topic, p, _replace_version(_with_epoch(state, controller_epoch),
                                                                        s.version), s.czxid)
        if new_partitions:
            await asyncio.gather(*(self._read_state(topic, p) for p in new_partitions))
        return stat.version

    async def delete_topic(self, name: str, controller_epoch: int, expected_version: int | None = None) -> None:
        """One multi-op: the controller-epoch check, /deleting/<topic> (created, or its CAS) naming this topic id
        and its replicas, and the removal of the topic's znodes and config. Raises UnknownTopic / StaleVersion."""
        self.session.require_connected()
        held = self.image.topics.get(name)
        if held is None:
            raise UnknownTopic(name)
        replicas = sorted({r for a in held.assignment.values() for r in a.replicas})
        deletion = self.image.deleting.get(name)
        pending = dict(deletion.pending) if deletion is not None else {}
        pending[held.topic_id] = tuple(replicas)
        base = self._p(topic_path(name))

        def build(txn: Any, partitions: Sequence[int] | None = None) -> None:
            if deletion is None:
                txn.create(self._p(f"{DELETING}/{name}"), znodes.deletion_json(pending))
            else:
                txn.set_data(self._p(f"{DELETING}/{name}"), znodes.deletion_json(pending), version=deletion.version)
            for p in sorted(held.assignment) if partitions is None else partitions:
                txn.delete(f"{base}/partitions/{p}/state")
                txn.delete(f"{base}/partitions/{p}")
            txn.delete(f"{base}/partitions")
            txn.delete(base, version=held.version if expected_version is None else expected_version)
            txn.delete(self._p(f"{TOPIC_CONFIGS}/{name}"))

        try:
            try:
                await self._commit(build, controller_epoch)
            except RequestTooLarge:
                # Too many partitions for one request: their znodes go first, a batch per multi-op (each pair of
                # state and partition znode together, so any controller can resume from what is left), then the
                # topic znode with the rest, atomically.
                await self._delete_partition_znodes(name, controller_epoch)
                await self._commit(lambda txn: build(txn, partitions=()), controller_epoch)
        except NoNodeError as exc:
            await self._read_topic(name)
            raise StaleVersion(f"topic {name} changed while being deleted") from exc
        except (BadVersionError, NodeExistsError, NotEmptyError) as exc:
            raise StaleVersion(f"topic {name} changed while being deleted") from exc
        self.image.remove_topic(name, held.created)
        await self._read_deletion(name)

    async def _delete_partition_znodes(self, name: str, controller_epoch: int) -> None:
        base = self._p(f"{topic_path(name)}/partitions")
        left = sorted(int(p) for p in await self._call(self._kz().get_children_async(base)) if p.isdigit())
        batch = deletion_batch(base, self.session.max_multi_bytes())
        for i in range(0, len(left), batch):
            def build(txn: Any, chunk: Sequence[int] = left[i:i + batch]) -> None:
                for p in chunk:
                    txn.delete(f"{base}/{p}/state")
                    txn.delete(f"{base}/{p}")
            await self._commit(build, controller_epoch)

    async def set_topic_configs(self, topic: str, configs: Mapping[str, str], expected_version: int,
                                controller_epoch: int) -> int:
        """CAS of a topic's config overrides (the whole set). Returns the new version."""
        self.session.require_connected()
        path = self._p(f"{TOPIC_CONFIGS}/{topic}")
        try:
            results = await self._commit(
                lambda txn: txn.set_data(path, znodes.dump({"config": dict(configs)}), version=expected_version),
                controller_epoch)
        except (BadVersionError, NoNodeError) as exc:
            raise StaleVersion(f"configs of {topic} changed since version {expected_version}") from exc
        stat = results[-1]
        self.image.apply_topic_configs(topic, configs, stat.version, stat.czxid)
        return stat.version

    async def complete_topic_deletion(self, topic: str, topic_id: bytes, node_id: int) -> None:
        """A broker reports its copy of a deleted topic gone; the last one removes /deleting/<topic>."""
        self.session.require_connected()
        path = self._p(f"{DELETING}/{topic}")
        for _ in range(20):
            try:
                data, stat = await self._call(self._kz().get_async(path))
            except NoNodeError:
                return
            deletion = znodes.deletion_from(topic, data, stat)
            if node_id not in deletion.pending.get(topic_id, ()):
                return
            pending = dict(deletion.pending)
            pending[topic_id] = tuple(r for r in pending[topic_id] if r != node_id)
            pending = {t: r for t, r in pending.items() if r}
            try:
                if pending:
                    await self._call(self._kz().set_async(path, znodes.deletion_json(pending), version=stat.version))
                else:
                    await self._call(self._kz().delete_async(path, version=stat.version))
                await self._read_deletion(topic)
                return
            except (BadVersionError, NoNodeError):
                continue
        raise StaleVersion(f"/deleting/{topic} kept changing")

    async def allocate_producer_ids(self, node_id: int, block_size: int) -> tuple[int, int]:
        """Reserve the next `block_size` producer ids for this broker: a CAS on /latest_producer_id_block, which
        holds the end of the last block handed out (Kafka's ZooKeeper-era allocation), so ids are unique across
        the cluster and never reused, whatever happens to a broker's disk. Returns [start, end)."""
        self.session.require_connected()
        path = self._p(PRODUCER_ID_BLOCK)
        for _ in range(100):
            try:
                data, stat = await self._call(self._kz().get_async(path))
            except NoNodeError:
                try:
                    await self._call(self._kz().create_async(
                        path, znodes.dump({"broker": node_id, "block_start": 0, "block_end": block_size}),
                        acl=self.session.acls(path)))
                    return 0, block_size
                except NodeExistsError:
                    continue
            start = int(znodes.load(data)["block_end"])
            value = znodes.dump({"broker": node_id, "block_start": start, "block_end": start + block_size})
            try:
                await self._call(self._kz().set_async(path, value, version=stat.version))
                return start, start + block_size
            except BadVersionError:
                continue
        raise StaleVersion("/latest_producer_id_block kept changing")


def _replace_version(state: PartitionState, version: int) -> PartitionState:
    return PartitionState(state.leader, state.leader_epoch, state.isr, state.controller_epoch, version,
                          state.log_start_floor)


def _with_epoch(state: PartitionState, controller_epoch: int) -> PartitionState:
    return PartitionState(state.leader, state.leader_epoch, state.isr, controller_epoch, state.version,
                          state.log_start_floor)
