"""A cluster's ACLs in ZooKeeper, shared by every broker (docs/security.md §5 and §8 step 6): `ZkAclStore`, the
`AclStore` of security/acl_store.py over Kafka's ZooKeeper-era layout (store/znodes.py: one znode per resource
pattern under /kafka-acl or /kafka-acl-extended/prefixed, its ACLs as Kafka's AclEntry JSON).

Each broker holds every binding in memory, read whole at start (before it serves) and after each reconnection,
and kept current by the change notifications under /kafka-acl-changes and /kafka-acl-extended-changes
(store/notifications.py): a notice names one resource pattern, whose znode is read again. After every change the
listener (the broker's `Authorizer.update`) gets the full list, so each broker's snapshot follows within a watch
round trip.

A broker that changes ACLs (CreateAcls, DeleteAcls) writes ZooKeeper itself, as Kafka's AclAuthorizer did: it
reads the znodes of the resources concerned with their versions and commits one multi-op that sets, creates or
deletes them at those versions and adds a notification per resource; a lost compare-and-set reads again and
retries. Then it reads back what it wrote, so its own authorizer has the change before the request is answered.
`create` and `delete` are coroutines (their writes are ZooKeeper round trips); `load` and `describe` answer from
memory.

A resource name that cannot be a znode's name (one with `/`, say; Kafka's ZooKeeper era could not keep it either)
is refused with INVALID_REQUEST.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kazoo.exceptions import NoNodeError

from ...errors import ErrorCode
from ...security.acl_store import CREATED, AclCreateResult, AclDeleteResult, AclListener
from ...security.acls import (
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    PatternType,
    ResourcePattern,
    validate_filter,
    validate_new_binding,
)
from . import znodes
from .errors import NotStored, StoreError
from .notifications import ChangeNotifications, Versioned, add_notice, update
from .session import StoreSession
from .znodes import ACL_CHANGE_PREFIX, ACL_CHANGES, ACL_ROOTS, acl_path

log = logging.getLogger(__name__)

Entries = tuple[AccessControlEntry, ...]


class ZkAclStore:
    """Every ACL of the cluster, in memory and in ZooKeeper (see the module docstring)."""

    def __init__(self, session: StoreSession, listener: AclListener | None = None) -> None:
        self.session = session
        self._listener = listener
        self._acls: dict[ResourcePattern, Entries] = {}
        self._lock = asyncio.Lock()        # the full reads, the notices and the read-backs, one at a time
        self._write_lock = asyncio.Lock()  # this broker's changes, one at a time
        self._changes = [
            ChangeNotifications(session, ACL_CHANGES[pattern_type], ACL_CHANGE_PREFIX, self._lock,
                                lambda data, pattern_type=pattern_type: self._on_notice(pattern_type, data))
            for pattern_type in ACL_ROOTS]

    # ---- reads ---------------------------------------------------------------------------------------------

    def set_listener(self, listener: AclListener | None) -> None:
        self._listener = listener

    def load(self) -> list[AclBinding]:
        """Every binding, from memory (read at `start`)."""
        return [AclBinding(pattern, entry) for pattern, entries in self._acls.items() for entry in entries]

    def describe(self, binding_filter: AclBindingFilter) -> list[AclBinding]:
        return [b for b in self.load() if binding_filter.matches(b)]

    async def start(self) -> None:
        """Create the layout where it is missing, then read everything (before the broker serves)."""
        for rel in znodes.SECURITY_LAYOUT:
            if rel.startswith("/kafka-acl"):
                await self.session.ensure_path(self.session.path(rel))
        await self.resync()

    async def resync(self) -> None:
        """Read every ACL again (at start, and after a reconnection dropped the watches); the listener hears the
        new list. A znode that cannot be read is a StoreError: a broker must not serve with some of its ACLs
        (a DENY among them) silently missing."""
        async with self._lock:
            for changes in self._changes:
                await changes.mark()
            fresh: dict[ResourcePattern, Entries] = {}
            for pattern_type, root in ACL_ROOTS.items():
                for type_dir in await self._children(root):
                    resource_type = znodes.acl_type_dir(type_dir)
                    if resource_type is None:
                        log.warning("ignoring %s%s/%s: not a resource type", self.session.root, root, type_dir)
                        continue
                    names = await self._children(f"{root}/{type_dir}")
                    patterns = [ResourcePattern(resource_type, name, pattern_type) for name in names]
                    for pattern, entries in zip(patterns, await asyncio.gather(*(self._read(p) for p in patterns)),
                                                strict=True):
                        if entries:
                            fresh[pattern] = entries
            self._acls = fresh
            self._tell()

    async def _children(self, rel: str) -> list[str]:
        try:
            return list(await self.session.call(self.session.kz().get_children_async(self.session.path(rel))))
        except NoNodeError:
            return []

    async def _read(self, pattern: ResourcePattern) -> Entries:
        """The ACLs of one resource pattern as ZooKeeper has them now (none if its znode is gone)."""
        try:
            data, _ = await self.session.call(self.session.kz().get_async(self.session.path(acl_path(pattern))))
        except NoNodeError:
            return ()
        try:
            return znodes.acls_from(data)
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            raise StoreError(f"the ACL znode {self.session.root}{acl_path(pattern)} cannot be read: {exc}") from None

    async def _refresh(self, patterns: Sequence[ResourcePattern]) -> None:
        """Read these patterns' znodes again into memory (under the lock) and tell the listener."""
        for pattern in patterns:
            entries = await self._read(pattern)
            if entries:
                self._acls[pattern] = entries
            else:
                self._acls.pop(pattern, None)
        self._tell()

    async def _on_notice(self, pattern_type: PatternType, data: bytes) -> None:
        pattern = znodes.acl_change_from(pattern_type, data)
        if znodes.znode_name_error(pattern.name) is not None:
            raise ValueError(f"a resource name no znode can have: {pattern.name!r}")
        try:
            await self._refresh([pattern])
        except StoreError as exc:        # keep what was held: dropping it could drop a DENY
            log.error("%s; keeping the ACLs held for %s", exc, pattern)

    def _tell(self) -> None:
        if self._listener is not None:
            self._listener(self.load())

    # ---- writes --------------------------------------------------------------------------------------------

    async def create(self, bindings: Sequence[AclBinding]) -> list[AclCreateResult]:
        """CreateAcls: per binding NONE or Kafka's error; an existing binding succeeds and changes nothing. All the
        new bindings are stored in one multi-op, or none (each then UNKNOWN_SERVER_ERROR)."""
        results: list[AclCreateResult] = []
        added: dict[ResourcePattern, dict[AccessControlEntry, None]] = {}
        for binding in bindings:
            error = validate_new_binding(binding)
            if error is not None:
                results.append(AclCreateResult(error.code, error.message))
                continue
            problem = znodes.znode_name_error(binding.pattern.name)
            if problem is not None:
                results.append(AclCreateResult(ErrorCode.INVALID_REQUEST, f"The resource name "
                                               f"{binding.pattern.name!r} cannot be kept in ZooKeeper: {problem}"))
                continue
            results.append(CREATED)
            added.setdefault(binding.pattern, {})[binding.entry] = None
        if not added:
            return results
        held = set(self.load())
        try:
            await self._update({p: lambda old, new=tuple(e): tuple(dict.fromkeys((*old, *new)))
                                for p, e in added.items()}, "new ACLs")
        except NotStored as exc:
            log.error("%s", exc)
            failed = AclCreateResult(ErrorCode.UNKNOWN_SERVER_ERROR, f"Could not store the ACLs: {exc}")
            results = [failed if r is CREATED and b not in held else r
                       for b, r in zip(bindings, results, strict=True)]
        return results

    async def delete(self, filters: Sequence[AclBindingFilter]) -> list[AclDeleteResult]:
        """DeleteAcls: per filter the bindings it matched (and so deleted) or its error. The resources are those
        this broker holds bindings of that a filter matches (as Kafka's AclAuthorizer found them, in its cache);
        their znodes are read fresh and every entry a filter matches there is deleted, in one multi-op."""
        valid: list[AclBindingFilter] = []
        errors: dict[int, AclDeleteResult] = {}
        for i, binding_filter in enumerate(filters):
            error = validate_filter(binding_filter)
            if error is not None:
                errors[i] = AclDeleteResult((), error.code, error.message)
            else:
                valid.append(binding_filter)
        patterns = [p for p, entries in self._acls.items()
                    if any(f.matches(AclBinding(p, e)) for e in entries for f in valid)]

        def keep(pattern: ResourcePattern) -> Callable[[Entries], Entries]:
            return lambda old: tuple(e for e in old if not any(f.matches(AclBinding(pattern, e)) for f in valid))

        removed: list[AclBinding] = []
        failure: AclDeleteResult | None = None
        if patterns:
            try:
                changed = await self._update({p: keep(p) for p in patterns}, "the deletion of ACLs")
            except NotStored as exc:
                log.error("%s", exc)
                failure = AclDeleteResult((), ErrorCode.UNKNOWN_SERVER_ERROR, f"Could not store the ACLs: {exc}")
            else:
                for pattern, (old, new) in changed.items():
                    removed.extend(AclBinding(pattern, e) for e in old if e not in new)
        results = []
        for i, binding_filter in enumerate(filters):
            if i in errors:
                results.append(errors[i])
                continue
            matched = tuple(b for b in removed if binding_filter.matches(b))
            if failure is not None and any(binding_filter.matches(b) for b in self.load()):
                results.append(failure)
            else:
                results.append(AclDeleteResult(matched))
        return results

    async def _update(self, edits: Mapping[ResourcePattern, Callable[[Entries], Entries]],
                      what: str) -> dict[ResourcePattern, tuple[Entries, Entries]]:
        """Apply `edits` (old entries -> new) to the patterns' znodes in one multi-op with a notification each,
        then read them back. Returns (old, new) of each pattern that changed. NotStored when it could not."""
        paths = {acl_path(p): p for p in edits}
        changed: dict[ResourcePattern, tuple[Entries, Entries]] = {}

        def plan(reads: Mapping[str, Versioned]) -> Callable[[Any], None] | None:
            changed.clear()
            for path, pattern in paths.items():
                old = znodes.acls_from(reads[path].data)
                new = edits[pattern](old)
                if set(new) != set(old):
                    changed[pattern] = (old, new)
            if not changed:
                return None

            def build(txn: Any) -> None:
                for pattern, (_, new) in changed.items():
                    read, path = reads[acl_path(pattern)], self.session.path(acl_path(pattern))
                    if not new:
                        txn.delete(path, read.version)
                    elif read.exists:
                        txn.set_data(path, znodes.acls_json(new), read.version)
                    else:
                        txn.create(path, znodes.acls_json(new))
                    add_notice(self.session, txn, ACL_CHANGES[pattern.pattern_type], ACL_CHANGE_PREFIX,
                               znodes.acl_change_json(pattern))
            return build

        try:
            async with self._write_lock:
                await update(self.session, list(paths), plan, what)
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            raise NotStored(f"could not store {what}: an ACL znode cannot be read: {exc}") from None
        if changed:
            for pattern, (old, new) in changed.items():
                log.info("ACLs of %s %s %s: %d -> %d", pattern.pattern_type.name, pattern.resource_type.name,
                         pattern.name, len(old), len(new))
            async with self._lock:
                try:
                    await self._refresh(list(changed))
                except StoreError as exc:    # stored: the notification brings it when it can be read
                    log.warning("reading back the ACLs just stored failed: %s", exc)
        return dict(changed)
