"""The reads that feed the broker's `MetadataImage` (docs/metadata-store.md, (f) and (g)).

- `full_read`: every registration, the controller, every topic with its states and configs, every deletion, in one
  image batch; at start and after each reconnection (kazoo drops every watch on a disconnect).
- Each read sets its watch. kazoo's thread only hands the path that fired to the loop (`_hop`), where `watched`
  names the read it asks for, run as a task of the session: the image is only ever changed on the loop, and a
  read that fails on a lost connection is left to the reconnection's full read.
- A topic marked `creating` (a creation in steps not finished) is not a topic yet: its name goes to
  `pending_creations` (shared with store/writes.py), and its watch tells when it is revealed.
- This broker's own registration seen gone is told to the facade (`broker_gone`), which registers again.
- The layout itself (`ensure_layout`, at start) and the debug reads (`dump`, `stat`, `children`) used by tests and
  `oncelog cluster` tools.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any

from kazoo.exceptions import NodeExistsError, NoNodeError
from kazoo.protocol.states import EventType

from ..metadata_image import NO_CONTROLLER, BrokerInfo, MetadataImage, PartitionState, TopicInfo
from . import znodes
from .session import StoreSession
from .znodes import (
    BROKERS,
    CLUSTER_ID,
    CONTROLLER,
    CONTROLLER_EPOCH,
    DELETING,
    TOPIC_CONFIGS,
    TOPICS,
    new_cluster_id,
    state_path,
    topic_path,
)


class ImageLoader:
    """Reads the layout into the image, and keeps it read: watches, and the re-reads they ask for."""

    def __init__(self, session: StoreSession, image: MetadataImage, pending_creations: set[str],
                 broker_gone: Callable[[int], None]) -> None:
        self.session = session
        self.image = image
        # Topics whose znode says `creating` (created in steps by a controller, not visible yet).
        self.pending_creations = pending_creations
        self._broker_gone = broker_gone
        self._call, self._kz, self._p = session.call, session.kz, session.path
        self._data_watch = self._on_watch                       # one callable per kind: kazoo keeps a set per path
        self._child_watch = self._on_child_watch

    async def ensure_layout(self, cluster_id: str | None) -> str:
        """Create the layout where it is missing, and the cluster id if absent (`cluster_id` proposes one); read the
        cluster id into the image and return it."""
        for rel in ("", BROKERS, TOPICS, TOPIC_CONFIGS, DELETING):
            await self.session.ensure_path(self._p(rel))
        try:
            await self._call(self._kz().create_async(self._p(CONTROLLER_EPOCH), znodes.dump({"controller_epoch": 0}),
                                                     acl=self.session.acls(self._p(CONTROLLER_EPOCH))))
        except NodeExistsError:
            pass
        proposed = cluster_id or new_cluster_id()
        try:
            await self._call(self._kz().create_async(self._p(CLUSTER_ID), znodes.dump({"id": proposed}),
                                                     acl=self.session.acls(self._p(CLUSTER_ID))))
        except NodeExistsError:
            pass
        data, _ = await self._call(self._kz().get_async(self._p(CLUSTER_ID)))
        found = str(znodes.load(data)["id"])
        self.image.apply_cluster_id(found)
        return found

    # ---- reads (each sets its watch and applies to the image) ------------------------------------------------

    async def full_read(self) -> None:
        """Everything, as one batch of the image (listeners see one delta)."""
        with self.image.batch():
            await asyncio.gather(self.read_brokers(), self.read_controller(), self.read_topics(full=True),
                                 self.read_deletions())

    async def read_brokers(self) -> None:
        try:
            ids = await self._call(self._kz().get_children_async(self._p(BROKERS), watch=self._child_watch))
        except NoNodeError:
            ids = []
        infos = await asyncio.gather(*(self._get_broker(int(i)) for i in ids if i.isdigit()))
        self.image.apply_brokers([i for i in infos if i is not None])

    async def _get_broker(self, node_id: int) -> BrokerInfo | None:
        try:
            data, stat = await self._call(self._kz().get_async(self._p(f"{BROKERS}/{node_id}"),
                                                               watch=self._data_watch))
        except NoNodeError:
            return None
        v = znodes.load(data)
        return BrokerInfo(node_id, str(v["host"]), int(v["port"]), v.get("rack"), stat.czxid, znodes.endpoints_from(v))

    async def read_broker(self, node_id: int) -> None:
        """One registration; when it is gone, the image drops it and the facade is told (`broker_gone`)."""
        info = await self._get_broker(node_id)
        if info is None:
            self.image.remove_broker(node_id)
            self._broker_gone(node_id)
        else:
            self.image.apply_broker(info)

    async def read_controller(self) -> None:
        path = self._p(CONTROLLER)
        stat = await self._call(self._kz().exists_async(path, watch=self._data_watch))
        if stat is None:
            self.image.apply_controller(NO_CONTROLLER, self.image.controller_epoch)
            return
        try:
            data, _ = await self._call(self._kz().get_async(path, watch=self._data_watch))
        except NoNodeError:
            self.image.apply_controller(NO_CONTROLLER, self.image.controller_epoch)
            return
        v = znodes.load(data)
        self.image.apply_controller(int(v["broker_id"]), int(v["controller_epoch"]))

    async def read_topics(self, full: bool = False) -> None:
        names = await self._call(self._kz().get_children_async(self._p(TOPICS), watch=self._child_watch))
        self.image.retain_topics(names)
        todo = names if full else [n for n in names if n not in self.image.topics]
        await asyncio.gather(*(self.read_topic(n, full=True) for n in todo))

    async def read_topic(self, name: str, full: bool = False) -> TopicInfo | None:
        """Read a topic znode; then the states not yet held (all of them with `full`) and, with `full`, its
        configs. With `full` the topic, its configs and its states enter the image as one delta: a listener never
        sees a new topic before its config overrides (a replica opened with the defaults of a topic created with
        `cleanup.policy=compact` or a short `retention.ms` would act on the wrong config meanwhile)."""
        held = self.image.topics.get(name)
        try:
            data, stat = await self._call(self._kz().get_async(self._p(topic_path(name)),
                                                               watch=self._data_watch))
        except NoNodeError:
            self.pending_creations.discard(name)
            self.image.remove_topic(name, held.created if held is not None else None)
            return None
        if znodes.creating(data):
            self.pending_creations.add(name)  # being created in steps: not a topic yet (its watch tells when)
            return None
        self.pending_creations.discard(name)
        info = znodes.topic_from(name, data, stat)
        if full or held is None or held.created != info.created:     # a new topic or a new incarnation
            partitions = list(info.assignment)
            configs, *states = await asyncio.gather(self._get_configs(name),
                                                    *(self._get_state(name, p) for p in partitions))
            with self.image.batch():
                self.image.apply_topic(info)
                if name in self.image.topics:
                    if configs is not None:
                        self.image.apply_topic_configs(name, *configs)
                    for p, state in zip(partitions, states, strict=True):
                        if state is not None:
                            self.image.apply_partition_state(name, p, *state)
            return self.image.topics.get(name)
        self.image.apply_topic(info)
        current = self.image.topics.get(name)
        if current is None:
            return None
        await asyncio.gather(*(self.read_state(name, p) for p in current.assignment
                               if (name, p) not in self.image.states))
        return self.image.topics.get(name)

    async def _get_state(self, topic: str, partition: int) -> tuple[PartitionState, int] | None:
        """A partition state znode as (state, czxid), watched; None once it is gone."""
        try:
            data, stat = await self._call(self._kz().get_async(self._p(state_path(topic, partition)),
                                                               watch=self._data_watch))
        except NoNodeError:
            return None                  # the topic is going: its znode watch removes it
        return znodes.state_from(data, stat), stat.czxid

    async def read_state(self, topic: str, partition: int) -> None:
        got = await self._get_state(topic, partition)
        if got is not None:
            self.image.apply_partition_state(topic, partition, *got)

    async def read_partition_state(self, topic: str, partition: int) -> PartitionState | None:
        """Re-read one state znode (after a lost CAS) and return what the image holds."""
        await self.read_state(topic, partition)
        return self.image.partition(topic, partition)

    async def _get_configs(self, topic: str) -> tuple[dict[str, str], int, int] | None:
        """A topic's config znode as (overrides, version, czxid), watched; None once it is gone."""
        try:
            data, stat = await self._call(self._kz().get_async(self._p(f"{TOPIC_CONFIGS}/{topic}"),
                                                               watch=self._data_watch))
        except NoNodeError:
            return None
        configs = {str(k): str(v) for k, v in znodes.load(data).get("config", {}).items()}
        return configs, stat.version, stat.czxid

    async def read_configs(self, topic: str) -> None:
        got = await self._get_configs(topic)
        if got is not None:
            self.image.apply_topic_configs(topic, *got)

    async def read_deletions(self) -> None:
        names = await self._call(self._kz().get_children_async(self._p(DELETING), watch=self._child_watch))
        self.image.retain_deletions(names)
        await asyncio.gather(*(self.read_deletion(n) for n in names))

    async def read_deletion(self, name: str) -> None:
        try:
            data, stat = await self._call(self._kz().get_async(self._p(f"{DELETING}/{name}"),
                                                               watch=self._data_watch))
        except NoNodeError:
            self.image.remove_deletion(name)
            return
        self.image.apply_deletion(znodes.deletion_from(name, data, stat))

    # ---- watches ---------------------------------------------------------------------------------------------

    def _on_watch(self, event: Any) -> None:         # kazoo's thread
        self._hop(event, children=False)

    def _on_child_watch(self, event: Any) -> None:   # kazoo's thread
        self._hop(event, children=True)

    def _hop(self, event: Any, children: bool) -> None:
        if event.type == EventType.NONE or not event.path:
            return                    # watches dropped by a disconnect: the reconnect re-reads everything
        try:
            self.session.loop.call_soon_threadsafe(self._dispatch, event.path, children)
        except RuntimeError:
            pass

    def _dispatch(self, path: str, children: bool) -> None:
        root = self.session.root
        if self.session.closing or not path.startswith(root):
            return
        rel = path[len(root):]
        found = watched(rel)
        if found is not None:
            read, args = found
            self.session.spawn(functools.partial(read, self, *args), rel)

    # ---- debug reads, for tests and tools --------------------------------------------------------------------

    async def dump(self, rel: str = "") -> dict[str, Any]:
        """The JSON value of a znode (for tests and `oncelog` diagnostics)."""
        data, _ = await self._call(self._kz().get_async(self._p(rel)))
        return znodes.load(data)

    async def stat(self, rel: str) -> Any:
        """A znode's ZooKeeper stat (versions, zxids: which transaction wrote it), for tests and diagnostics."""
        _, stat = await self._call(self._kz().get_async(self._p(rel)))
        return stat

    async def children(self, rel: str) -> list[str]:
        return list(await self._call(self._kz().get_children_async(self._p(rel))))


def watched(rel: str) -> tuple[Callable[..., Awaitable[Any]], tuple[Any, ...]] | None:
    """What a watch that fired on `rel` (a path under the chroot) asks to re-read: an ImageLoader read and its
    arguments, or None for a path no read watches."""
    parts = rel.strip("/").split("/")
    if rel == BROKERS:
        return ImageLoader.read_brokers, ()
    if rel.startswith(BROKERS + "/") and len(parts) == 3 and parts[2].isdigit():
        return ImageLoader.read_broker, (int(parts[2]),)
    if rel == CONTROLLER:
        return ImageLoader.read_controller, ()
    if rel == TOPICS:
        return ImageLoader.read_topics, ()
    if parts[0] == "topics" and len(parts) == 2:
        return ImageLoader.read_topic, (parts[1],)
    if parts[0] == "topics" and len(parts) == 5 and parts[4] == "state" and parts[3].isdigit():
        return ImageLoader.read_state, (parts[1], int(parts[3]))
    if rel.startswith(TOPIC_CONFIGS + "/") and len(parts) == 3:
        return ImageLoader.read_configs, (parts[2],)
    if rel == DELETING:
        return ImageLoader.read_deletions, ()
    if parts[0] == "deleting" and len(parts) == 2:
        return ImageLoader.read_deletion, (parts[1],)
    return None
