"""Cluster metadata on ZooKeeper: the znode layout of docs/cluster.md §2, its writes, its watches, the session.

The facade over the rooms of `cluster/store/` (docs/metadata-store.md): `MetadataStore` builds one of each over one
`StoreSession` and keeps the names its callers (the broker's cluster mode, the controller, the tests) have always
used, by delegation:

- store/session.py: the main and seat sessions, their states, the lease of §5.4, requests bridged from kazoo's
  threads to the loop, the multi-op behind the /controller_epoch check;
- store/registration.py: this broker's registration (an ephemeral znode whose czxid is the broker epoch) and the
  controller seat (an ephemeral /controller created together with the increment of /controller_epoch);
- store/writes.py: every write the controller and partition leaders make, compare-and-set on znode versions and,
  for the controller, behind its epoch check in the same multi-op, so a deposed controller's writes fail as a unit;
- store/loader.py: the reads and watches that feed the `MetadataImage`, and the debug reads;
- store/acls.py, store/credentials.py, store/quotas.py (over store/entity_configs.py, with store/notifications.py):
  the ACLs, SCRAM credentials and client quotas every broker shares (docs/security.md §8 step 6), started by
  `start_security` before the broker serves.

What crosses rooms is decided here: what a change of session means (after a new session, register again, then read
everything, the security stores included, then announce CONNECTED, in that order), and that this broker's own
registration seen removed is registered again. The rooms import neither this module nor each other beyond the session.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .connect import parse_connect
from .metadata_image import MetadataImage, PartitionAssignment, PartitionState, TopicInfo
from .store import znodes
from .store.acls import ZkAclStore
from .store.credentials import ZkCredentialStore
from .store.entity_configs import EntityConfigs
from .store.errors import (  # noqa: F401 - callers import these names from here
    CONNECTED,
    LOST,
    SUSPENDED,
    BrokerIdInUse,
    NotController,
    RequestTooLarge,
    StaleVersion,
    StoreError,
    StoreUnavailable,
    TopicExists,
    UnknownTopic,
)
from .store.loader import ImageLoader
from .store.quotas import ZkQuotaStore
from .store.registration import BrokerRegistration, ControllerSeat
from .store.session import Build, SessionHooks, StoreSession
from .store.writes import MetadataWrites
from .store.znode_acls import KEYS as ZK_SECURITY_KEYS  # noqa: F401 - callers import it from here
from .store.znode_acls import OPEN, ZkSecurity, zk_security  # noqa: F401 - callers import zk_security from here
from .store.znodes import (  # noqa: F401 - callers import these names from here
    BROKERS,
    CLUSTER_ID,
    CONTROLLER,
    CONTROLLER_EPOCH,
    DEFAULT_CHROOT,
    DELETING,
    FORMAT_VERSION,
    MAX_MULTI_BYTES,
    PRODUCER_ID_BLOCK,
    TOPIC_CONFIGS,
    TOPICS,
    decode_topic_id,
    encode_topic_id,
    new_cluster_id,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SecurityStores:
    """The stores a cluster broker's security keeps in ZooKeeper (`MetadataStore.start_security`): ACLs (None
    without an authorizer), SCRAM credentials and client quotas (both over the users' and client ids' config
    entities)."""

    acls: ZkAclStore | None
    credentials: ZkCredentialStore
    quotas: ZkQuotaStore
    configs: EntityConfigs

    async def resync(self) -> None:
        await self.configs.resync()
        if self.acls is not None:
            await self.acls.resync()


class MetadataStore:
    """One broker's ZooKeeper session: its registration, its writes, and the watches that feed its image."""

    def __init__(
        self,
        connect: str,
        session_timeout_ms: int,
        loop: asyncio.AbstractEventLoop,
        image: MetadataImage,
        chroot: str = DEFAULT_CHROOT,
        controller_session_timeout_ms: int | None = None,
        security: ZkSecurity = OPEN,
    ) -> None:
        parsed = parse_connect(connect)
        self.connect = connect
        self.servers = parsed.servers
        self.root = (parsed.chroot or chroot).rstrip("/")
        self.session_timeout_ms = session_timeout_ms
        self.seat_timeout_ms = controller_session_timeout_ms
        self.loop = loop
        self.image = image
        self.cluster_id = ""
        self.fatal_error: BaseException | None = None
        # Topics whose znode says `creating` (created in steps by a controller, not visible yet): the loader's
        # reads and the writes both keep it.
        self.pending_creations: set[str] = set()
        self.security: SecurityStores | None = None      # once start_security has read them
        hooks = SessionHooks(main_lost=self._main_session_lost, main_replaced=self._main_session_replaced,
                             resync=self._resync, seat_lost=self._seat_session_lost,
                             seat_replaced=self._seat_session_replaced)
        # MAX_MULTI_BYTES is read from this module at each request: lowering it here is how tests make small
        # topics reach the limit.
        self.session = StoreSession(self.servers, self.root, session_timeout_ms, loop, hooks,
                                    controller_session_timeout_ms, max_multi_bytes=lambda: MAX_MULTI_BYTES,
                                    security=security)

        # Controller writes call `_commit` through this, looked up at each call: a test that replaces the store's
        # `_commit` sees every one of them.
        def commit(build: Build, controller_epoch: int | None) -> Awaitable[list[Any]]:
            return self._commit(build, controller_epoch)

        self.loader = ImageLoader(self.session, image, self.pending_creations, self._registration_removed)
        self.registration = BrokerRegistration(self.session, image, self.loader.read_broker, commit)
        self.seat = ControllerSeat(self.session, image, self.loader.read_controller)
        self.writes = MetadataWrites(self.session, image, commit, self.pending_creations,
                                     read_topic=self.loader.read_topic, read_state=self.loader.read_state,
                                     read_deletion=self.loader.read_deletion)

    @staticmethod
    def topic_path(topic: str) -> str:
        return znodes.topic_path(topic)

    @staticmethod
    def state_path(topic: str, partition: int) -> str:
        return znodes.state_path(topic, partition)

    # ---- lifecycle -------------------------------------------------------------------------------------------

    async def start(self, timeout_s: float, cluster_id: str | None = None) -> None:
        """Connect (retrying with backoff and logging while the service is unreachable), create the layout,
        create the cluster id if absent (`cluster_id` proposes one), read the whole image and set its watches.
        Raises StoreUnavailable if no session opened within `timeout_s`, ZkAuthError if ZooKeeper refused the login
        (later refusals are retried: store/session.py)."""
        deadline = self.loop.time() + timeout_s
        await self.session.open(deadline, timeout_s)
        self.cluster_id = await self.loader.ensure_layout(cluster_id)
        await self.session.open_seat(deadline, timeout_s)
        await self.loader.full_read()
        self.session.set_state(CONNECTED)
        self.session.start_lease()
        self.session.mark_started()      # a login refused from now on is retried, as a lost session is recovered
        log.info("metadata store connected to %s%s, cluster id %s", self.servers, self.root, self.cluster_id)

    async def start_security(self, acls: bool) -> SecurityStores:
        """After `start`: read the ACLs (with `acls`: the broker has an authorizer), SCRAM credentials and client
        quotas, creating their layout where it is missing, and follow their change notifications; they are read
        again after every reconnection. A broker calls this before it serves, so its first request sees them all."""
        configs = EntityConfigs(self.session)
        await configs.start()
        acl_store = None
        if acls:
            acl_store = ZkAclStore(self.session)
            await acl_store.start()
        self.security = SecurityStores(acl_store, ZkCredentialStore(configs), ZkQuotaStore(configs), configs)
        return self.security

    async def close(self) -> None:
        """End the sessions (ephemeral znodes go at once) and stop kazoo's threads."""
        await self.session.close()
        self.registration.forget()
        self.seat.forget()

    # ---- what crosses rooms: the session's hooks, a removed registration -------------------------------------

    def _main_session_lost(self) -> None:
        self.registration.session_lost()
        self.seat.main_session_lost()

    def _main_session_replaced(self) -> None:
        self.seat.forget()
        log.info("new ZooKeeper session %s after expiry: registering again and re-reading metadata",
                 hex(self.session.session_id or 0))

    async def _resync(self) -> None:
        """After a reconnection kazoo has dropped every watch: read everything again, retried while connected.
        After a new session (the old one expired) register again first, which gives this broker a new epoch; only
        then announce CONNECTED, so a listener that sees it sees this session's epoch and image."""
        backoff = 0.2
        while self.session.connected:
            try:
                await self.registration.renew_after_new_session()
                await self.loader.full_read()
                if self.security is not None:
                    await self.security.resync()
                self.session.set_state(CONNECTED)
                return
            except asyncio.CancelledError:
                raise
            except BrokerIdInUse as exc:
                log.error("cannot register again: %s", exc)
                self.fatal_error = exc
                self.session.set_state(LOST)
                return
            except StoreUnavailable:
                if not self.session.connected:
                    return      # the connection went again (or the login was refused): its return re-reads
                log.exception("re-reading metadata after reconnect failed; retrying in %.1fs", backoff)
            except Exception:
                log.exception("re-reading metadata after reconnect failed; retrying in %.1fs", backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.timeout_s / 3)

    def _seat_session_lost(self) -> None:
        self.seat.seat_session_lost()

    def _seat_session_replaced(self) -> None:
        self.seat.forget()

    def _registration_removed(self, node_id: int) -> None:
        """A watch saw /brokers/ids/<node_id> gone (the image has dropped it); this broker's own registers again."""
        self.registration.removed(node_id)

    # ---- the session (store/session.py) ----------------------------------------------------------------------

    @property
    def timeout_s(self) -> float:
        return self.session.timeout_s

    @property
    def state(self) -> str:
        return self.session.state

    @property
    def seat_state(self) -> str:
        return self.session.seat_state

    @property
    def negotiated_ms(self) -> dict[str, int]:
        """What ZooKeeper granted: "broker" / "controller" -> session timeout in ms."""
        return self.session.negotiated_ms

    @property
    def session_id(self) -> int | None:
        return self.session.session_id

    @property
    def seat_session_id(self) -> int | None:
        """The session that owns /controller when this broker holds it (ephemeralOwner)."""
        return self.session.seat_session_id

    @property
    def controller_usable(self) -> bool:
        """Whether this broker may act as controller as far as its sessions go: the main one (its registration,
        its writes) and the seat's are both CONNECTED."""
        return self.session.controller_usable

    def client_id(self) -> tuple[int, bytes] | None:
        """kazoo's (session id, password): lets a test expire this session from another client."""
        return self.session.client_id()

    def lease_valid(self) -> bool:
        """Whether acks=all may still be acknowledged (docs/cluster.md §5.4): StoreSession.lease_valid."""
        return self.session.lease_valid()

    def on_state_change(self, listener: Callable[[str], None]) -> None:
        """`listener(state)` on the loop at each change of `state`; CONNECTED comes after the image is re-read."""
        self.session.on_state_change(listener)

    def on_seat_state_change(self, listener: Callable[[str], None]) -> None:
        """`listener(state)` on the loop at each change of `seat_state` (only with a seat session)."""
        self.session.on_seat_state_change(listener)

    # ---- registration and the controller seat (store/registration.py) ----------------------------------------

    @property
    def broker_epoch(self) -> int | None:
        return self.registration.broker_epoch

    @property
    def keep_registered(self) -> bool:
        """False once the broker is leaving: a removed registration stays removed."""
        return self.registration.keep_registered

    @keep_registered.setter
    def keep_registered(self, keep: bool) -> None:
        self.registration.keep_registered = keep

    async def register_broker(self, node_id: int, host: str, port: int, rack: str | None = None, *,
                              instance_id: str | None = None, extra: Mapping[str, Any] | None = None) -> int:
        """Create /brokers/ids/<node_id> (ephemeral) and return the broker epoch (its czxid); see
        BrokerRegistration.register. Registers again by itself after a session expiry."""
        return await self.registration.register(node_id, host, port, rack, instance_id=instance_id, extra=extra)

    async def expire_registration(self, node_id: int, broker_epoch: int, controller_epoch: int) -> bool:
        """Delete broker `node_id`'s registration if it is still the incarnation `broker_epoch`, as this controller.
        Returns whether it was deleted."""
        return await self.registration.expire(node_id, broker_epoch, controller_epoch)

    @property
    def controller_epoch(self) -> int | None:
        """The controller epoch this broker holds, or None."""
        return self.seat.epoch

    async def try_become_controller(self, node_id: int, broker_epoch: int) -> int | None:
        """Take the seat if it is free: the new controller epoch, or None when another broker holds it."""
        return await self.seat.try_take(node_id, broker_epoch)

    async def resign_controller(self, controller_epoch: int) -> None:
        await self.seat.resign(controller_epoch)

    async def seat_still_held(self) -> bool:
        return await self.seat.still_held()

    async def release_seat(self) -> bool:
        return await self.seat.release()

    async def _commit(self, build: Build, controller_epoch: int | None, *, seat: bool = False) -> list[Any]:
        """The multi-op behind this controller's epoch check that every controller write goes through
        (ControllerSeat.commit)."""
        return await self.seat.commit(build, controller_epoch, seat=seat)

    # ---- writes (store/writes.py) ----------------------------------------------------------------------------

    async def create_topic(
        self,
        name: str,
        topic_id: bytes,
        assignment: Mapping[int, Sequence[int]],
        configs: Mapping[str, str],
        controller_epoch: int,
        initial: Mapping[int, tuple[int, Sequence[int]]] | None = None,
    ) -> TopicInfo:
        """Create a topic as the controller (in steps when too big for one request); see MetadataWrites."""
        return await self.writes.create_topic(name, topic_id, assignment, configs, controller_epoch, initial)

    async def abandon_creations(self, controller_epoch: int, only: str | None = None) -> list[str]:
        return await self.writes.abandon_creations(controller_epoch, only)

    async def write_partition_states(self, changes: Sequence[tuple[str, int, PartitionState, int]],
                                     controller_epoch: int) -> None:
        await self.writes.write_partition_states(changes, controller_epoch)

    async def write_partition_state(self, topic: str, partition: int, new: PartitionState, expected_version: int,
                                    controller_epoch: int | None) -> int:
        return await self.writes.write_partition_state(topic, partition, new, expected_version, controller_epoch)

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
        return await self.writes.write_assignment(topic, assignment, expected_version, controller_epoch,
                                                  new_partitions=new_partitions, states=states)

    async def delete_topic(self, name: str, controller_epoch: int, expected_version: int | None = None) -> None:
        await self.writes.delete_topic(name, controller_epoch, expected_version)

    async def set_topic_configs(self, topic: str, configs: Mapping[str, str], expected_version: int,
                                controller_epoch: int) -> int:
        return await self.writes.set_topic_configs(topic, configs, expected_version, controller_epoch)

    async def complete_topic_deletion(self, topic: str, topic_id: bytes, node_id: int) -> None:
        await self.writes.complete_topic_deletion(topic, topic_id, node_id)

    async def allocate_producer_ids(self, node_id: int, block_size: int) -> tuple[int, int]:
        return await self.writes.allocate_producer_ids(node_id, block_size)

    # ---- reads (store/loader.py) -----------------------------------------------------------------------------

    async def refresh_brokers(self) -> None:
        """Re-read /brokers/ids and every registration (a new controller does this first, §5.3)."""
        await self.loader.read_brokers()

    async def read_partition_state(self, topic: str, partition: int) -> PartitionState | None:
        """Re-read one state znode (after a lost CAS) and return what the image holds."""
        return await self.loader.read_partition_state(topic, partition)

    async def read_topic(self, name: str) -> TopicInfo | None:
        return await self.loader.read_topic(name, full=True)

    def config_version(self, topic: str) -> int | None:
        """The version of the topic's config znode as the image holds it (the CAS token for set_topic_configs)."""
        return self.image.config_version(topic)

    async def dump(self, rel: str = "") -> dict[str, Any]:
        """The JSON value of a znode (for tests and `oncelog` diagnostics)."""
        return await self.loader.dump(rel)

    async def stat(self, rel: str) -> Any:
        """A znode's ZooKeeper stat (versions, zxids: which transaction wrote it), for tests and diagnostics."""
        return await self.loader.stat(rel)

    async def children(self, rel: str) -> list[str]:
        return await self.loader.children(rel)
