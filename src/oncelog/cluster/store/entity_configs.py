"""Kafka's config entities of users and client ids in ZooKeeper (/config/users/<user>,
/config/users/<user>/clients/<client-id>, /config/clients/<client-id>, `<default>` for a default), where a cluster
keeps SCRAM credentials (store/credentials.py) and client quotas (store/quotas.py), shared by every broker.

`EntityConfigs` holds every such entity's config in memory (entity path, as Kafka writes it in its notifications:
"users/alice", "users/alice/clients/app", "clients/<default>", names sanitized), read whole at start and after each
reconnection, and kept current by /config/changes/config_change_<seq> notifications (store/notifications.py).
`alter` changes entities as Kafka's AdminZkClient.changeEntityConfig did, each a compare-and-set on its znode
version, all of them and their notifications in one multi-op; then it reads back what it wrote, so this broker has
the change before the request is answered. Listeners hear the entity paths that changed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kazoo.exceptions import NoNodeError

from . import znodes
from .errors import NotStored, StoreError
from .notifications import ChangeNotifications, Versioned, add_notice, update
from .session import StoreSession
from .znodes import CONFIG_CHANGE_PREFIX, CONFIG_CHANGES, CONFIG_CLIENTS, CONFIG_USERS, entity_znode

log = logging.getLogger(__name__)

Config = dict[str, str]
Edit = Callable[[Config], Config]
ChangeListener = Callable[[set[str]], None]


def _parents(entity_path: str) -> list[str]:
    """The znodes that must exist before an entity's ("users/a/clients/b" needs /config/users/a and its
    /clients), relative to the chroot."""
    parts = entity_path.split("/")
    if len(parts) == 4:
        return [entity_znode("/".join(parts[:2])), entity_znode("/".join(parts[:3]))]
    return []


class EntityConfigs:
    """Every user and client-id config entity, in memory and in ZooKeeper (see the module docstring)."""

    def __init__(self, session: StoreSession) -> None:
        self.session = session
        self.configs: dict[str, Config] = {}
        self._listeners: list[ChangeListener] = []
        self._lock = asyncio.Lock()        # the full reads, the notices and the read-backs, one at a time
        self._write_lock = asyncio.Lock()  # this broker's changes, one at a time
        self._changes = ChangeNotifications(session, CONFIG_CHANGES, CONFIG_CHANGE_PREFIX, self._lock, self._on_notice)

    def subscribe(self, listener: ChangeListener) -> None:
        self._listeners.append(listener)

    async def start(self) -> None:
        for rel in (CONFIG_USERS, CONFIG_CLIENTS, CONFIG_CHANGES):
            await self.session.ensure_path(self.session.path(rel))
        await self.resync()

    async def resync(self) -> None:
        """Read every entity again (at start, after a reconnection); listeners hear every path that changed."""
        async with self._lock:
            await self._changes.mark()
            fresh: dict[str, Config] = {}
            users = await self._children(CONFIG_USERS)
            user_paths = [f"users/{u}" for u in users]
            clients_of = await asyncio.gather(*(self._children(f"{entity_znode(p)}/clients") for p in user_paths))
            paths = [*user_paths,
                     *(f"{p}/clients/{c}" for p, clients in zip(user_paths, clients_of, strict=True) for c in clients),
                     *(f"clients/{c}" for c in await self._children(CONFIG_CLIENTS))]
            for path, config in zip(paths, await asyncio.gather(*(self._read(p) for p in paths)), strict=True):
                if config is not None:
                    fresh[path] = config
            changed = {p for p in set(fresh) | set(self.configs) if fresh.get(p) != self.configs.get(p)}
            self.configs = fresh
            self._tell(changed)

    async def _children(self, rel: str) -> list[str]:
        try:
            return list(await self.session.call(self.session.kz().get_children_async(self.session.path(rel))))
        except NoNodeError:
            return []

    async def _read(self, entity_path: str) -> Config | None:
        """An entity's config as ZooKeeper has it now; None when its znode is gone. A value that is not Kafka's
        config JSON reads as no config (logged): nothing in it can be used."""
        try:
            data, _ = await self.session.call(self.session.kz().get_async(self.session.path(entity_znode(entity_path))))
        except NoNodeError:
            return None
        try:
            return znodes.config_from(data)
        except (ValueError, UnicodeDecodeError) as exc:
            log.warning("ignoring the config of %s%s: %s", self.session.root, entity_znode(entity_path), exc)
            return {}

    async def _refresh(self, paths: Iterable[str]) -> None:
        changed = set()
        for path in paths:
            config = await self._read(path)
            if config != self.configs.get(path):
                changed.add(path)
                if config is None:
                    self.configs.pop(path, None)
                else:
                    self.configs[path] = config
        self._tell(changed)

    async def _on_notice(self, data: bytes) -> None:
        path = znodes.config_change_from(data)
        if path.split("/", 1)[0] not in ("users", "clients"):
            return                       # topics, brokers, ips: not kept here
        znodes.parse_entity_path(path)   # ValueError for a path that names no entity
        await self._refresh([path])

    def _tell(self, changed: set[str]) -> None:
        if not changed:
            return
        for listener in list(self._listeners):
            try:
                listener(changed)
            except Exception:
                log.exception("config entity listener failed")

    async def alter(self, edits: Mapping[str, Edit], what: str) -> set[str]:
        """Apply `edits` (entity path -> old config -> new config) in one multi-op with a notification per changed
        entity; read them back. Returns the entity paths that changed. NotStored when it could not be stored."""
        paths = list(dict.fromkeys([*(entity_znode(p) for p in edits), *(q for p in edits for q in _parents(p))]))
        changed: dict[str, Config] = {}

        def plan(reads: Mapping[str, Versioned]) -> Callable[[Any], None] | None:
            changed.clear()
            for entity_path, edit in edits.items():
                old = znodes.config_from(reads[entity_znode(entity_path)].data)
                new = edit(dict(old))
                if new != old:
                    changed[entity_path] = new
            if not changed:
                return None

            def build(txn: Any) -> None:
                created: set[str] = set()
                for entity_path, new in changed.items():
                    for parent in _parents(entity_path):
                        if not reads[parent].exists and parent not in created:
                            txn.create(self.session.path(parent), b"")   # as Kafka's createRecursive: no data
                            created.add(parent)
                    rel = entity_znode(entity_path)
                    if reads[rel].exists:
                        txn.set_data(self.session.path(rel), znodes.config_json(new), reads[rel].version)
                    else:
                        txn.create(self.session.path(rel), znodes.config_json(new))
                    add_notice(self.session, txn, CONFIG_CHANGES, CONFIG_CHANGE_PREFIX,
                               znodes.config_change_json(entity_path))
            return build

        try:
            async with self._write_lock:
                await update(self.session, paths, plan, what)
        except (ValueError, UnicodeDecodeError) as exc:
            raise NotStored(f"could not store {what}: a config znode cannot be read: {exc}") from None
        if changed:
            async with self._lock:
                try:
                    await self._refresh(list(changed))
                except StoreError as exc:     # stored: the notification brings it when it can be read
                    log.warning("reading back the configs just stored failed: %s", exc)
        return set(changed)
