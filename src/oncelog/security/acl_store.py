"""Where ACLs are kept: the `AclStore` protocol, and the single node's store, one JSON file.

`LocalAclStore` keeps every binding in one file, replaced atomically (temp file, fsync, rename, fsync of the
directory: `storage.checkpoints.atomic_write`), so after a SIGKILL or a power cut the file holds either the list
before a change or the list after it, never a torn one; a temp file left by a crash is never read. An unreadable
file is an error, never an empty list: losing the ACLs silently would turn DENY rules off and, with
`allow.everyone.if.no.acl.found`, open every resource.

Synchronous on purpose: ACL changes are rare admin requests and the file is small (about 150 bytes a binding), so
a change is one short write and two fsyncs; doing it inline keeps "stored, then answered" trivially true and the
order of changes the order of calls. A lock makes the store safe to call from a worker thread
(`asyncio.to_thread`) where a slow disk must not stall the event loop.

Every change calls the listener with the new full list, under that lock so listeners see changes in order; the
broker's listener is `Authorizer.update`, which builds a new snapshot and swaps it in.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from oncelog.errors import ErrorCode

from ..durable_file import atomic_write, fsync_dir
from .acls import (
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
    check_supported_operation,
    validate_filter,
    validate_new_binding,
)

log = logging.getLogger("oncelog.security.acl_store")

FORMAT_VERSION = 1

AclListener = Callable[[list[AclBinding]], None]


@dataclass(frozen=True, slots=True)
class AclCreateResult:
    """One CreateAcls result: NONE, or the error Kafka would answer for that binding."""

    error_code: ErrorCode = ErrorCode.NONE
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class AclDeleteResult:
    """One DeleteAcls filter's result: the bindings it matched (and so deleted), or an error for the filter."""

    deleted: tuple[AclBinding, ...] = ()
    error_code: ErrorCode = ErrorCode.NONE
    error_message: str | None = None


CREATED = AclCreateResult()


class AclStoreError(ValueError):
    """The stored ACLs cannot be read; the message names the file and what is wrong."""


@runtime_checkable
class AclStore(Protocol):
    """What the broker needs of an ACL store; the single node's file and the cluster's znodes both provide it.

    `create` and `delete` answer per binding / per filter in request order (Kafka's CreateAcls and DeleteAcls
    results). Creating an existing binding succeeds and changes nothing. Every filter of one `delete` call sees the
    bindings as they were before the call, so a binding two filters match is reported by both, as Kafka's
    controller does. After any change that took effect the listener gets the new full list.

    `create` and `delete` answer at once (the single node's file) or as a coroutine (a cluster's znodes,
    cluster/store/acls.py): callers take either with `security.settled.settled`. `load` and `describe` always
    answer at once, from what the store holds."""

    def load(self) -> list[AclBinding]: ...

    def create(self, bindings: Sequence[AclBinding]) -> list[AclCreateResult] | Awaitable[list[AclCreateResult]]: ...

    def delete(self, filters: Sequence[AclBindingFilter]) -> list[AclDeleteResult] | Awaitable[list[AclDeleteResult]]:
        ...

    def describe(self, binding_filter: AclBindingFilter) -> list[AclBinding]: ...

    def set_listener(self, listener: AclListener | None) -> None: ...


def encode_bindings(bindings: Iterable[AclBinding]) -> bytes:
    """The file's JSON: enum names rather than codes, so an operator can read it; field names as Kafka's
    AccessControlEntryRecord."""
    acls = [
        {
            "resourceType": b.pattern.resource_type.name,
            "resourceName": b.pattern.name,
            "patternType": b.pattern.pattern_type.name,
            "principal": b.entry.principal,
            "host": b.entry.host,
            "operation": b.entry.operation.name,
            "permissionType": b.entry.permission.name,
        }
        for b in bindings
    ]
    return (json.dumps({"version": FORMAT_VERSION, "acls": acls}, indent=1) + "\n").encode()


def decode_bindings(data: bytes, source: str) -> list[AclBinding]:
    """The bindings of a file written by `encode_bindings`; AclStoreError naming `source` for anything else,
    including a binding CreateAcls would have refused."""
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AclStoreError(f"ACL file {source} is not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("version") != FORMAT_VERSION or not isinstance(doc.get("acls"), list):
        raise AclStoreError(f"ACL file {source} is not a version {FORMAT_VERSION} ACL list")
    bindings: list[AclBinding] = []
    for i, item in enumerate(doc["acls"]):
        try:
            binding = _decode_one(item)
        except (KeyError, TypeError, ValueError) as exc:
            raise AclStoreError(f"ACL file {source}, entry {i}: malformed ({exc!r}): {item!r}") from None
        error = validate_new_binding(binding)
        if error is not None:
            raise AclStoreError(f"ACL file {source}, entry {i}: {error.message}: {item!r}")
        bindings.append(binding)
    return bindings


def _decode_one(item: dict[str, Any]) -> AclBinding:
    def text(key: str) -> str:
        value = item[key]
        if not isinstance(value, str):
            raise TypeError(f"{key} is not a string")
        return value

    return AclBinding(
        ResourcePattern(ResourceType[text("resourceType")], text("resourceName"), PatternType[text("patternType")]),
        AccessControlEntry(text("principal"), text("host"), AclOperation[text("operation")],
                           AclPermissionType[text("permissionType")]),
    )


class LocalAclStore:
    """The single node's ACLs in one JSON file (see the module docstring for why it is written as it is).

    `check_operations` adds the kafka-acls tool's operation-per-resource-type check to CreateAcls; off by
    default, as a Kafka broker does not make it."""

    def __init__(self, path: str | os.PathLike, listener: AclListener | None = None, *,
                 check_operations: bool = False) -> None:
        self.path = Path(path)
        self.check_operations = check_operations
        self._listener = listener
        self._lock = threading.Lock()
        self._bindings: dict[AclBinding, None] | None = None  # an ordered set; None until loaded

    def set_listener(self, listener: AclListener | None) -> None:
        self._listener = listener

    def load(self) -> list[AclBinding]:
        """Read the file (no file: no ACLs). Does not call the listener: nothing changed."""
        with self._lock:
            return list(self._read())

    def _read(self) -> dict[AclBinding, None]:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            bindings: list[AclBinding] = []
        else:
            bindings = decode_bindings(data, str(self.path))
        self._bindings = dict.fromkeys(bindings)
        return self._bindings

    def _current(self) -> dict[AclBinding, None]:
        return self._bindings if self._bindings is not None else self._read()

    def _store(self, new: dict[AclBinding, None]) -> None:
        """Write `new` durably, then make it current and tell the listener.

        On OSError the old list stays current (should the rename have happened and only the directory's fsync
        failed, the file may already hold `new`; the next change rewrites it from the current list). A listener's
        exception propagates after the change is stored: a broker whose authorizer missed a change must hear it."""
        parent = self.path.parent
        if not parent.exists():
            parent.mkdir(parents=True, exist_ok=True)
            fsync_dir(parent.parent)
        atomic_write(self.path, encode_bindings(new))
        self._bindings = new
        if self._listener is not None:
            self._listener(list(new))

    def create(self, bindings: Sequence[AclBinding]) -> list[AclCreateResult]:
        with self._lock:
            current = self._current()
            results: list[AclCreateResult] = []
            added: dict[AclBinding, None] = {}
            for binding in bindings:
                error = validate_new_binding(binding)
                if error is None and self.check_operations:
                    error = check_supported_operation(binding)
                if error is not None:
                    results.append(AclCreateResult(error.code, error.message))
                    continue
                results.append(CREATED)
                if binding not in current:
                    added[binding] = None
            if added:
                try:
                    self._store({**current, **added})
                except OSError as exc:
                    log.exception("Could not store %d new ACL(s) in %s", len(added), self.path)
                    failed = AclCreateResult(ErrorCode.UNKNOWN_SERVER_ERROR, f"Could not store the ACLs: {exc}")
                    # the bindings that were stored before this call stay created; the new ones failed
                    results = [failed if b in added and r is CREATED else r
                               for b, r in zip(bindings, results, strict=True)]
            return results

    def delete(self, filters: Sequence[AclBindingFilter]) -> list[AclDeleteResult]:
        with self._lock:
            current = self._current()
            results: list[AclDeleteResult] = []
            removed: set[AclBinding] = set()
            for binding_filter in filters:
                error = validate_filter(binding_filter)
                if error is not None:
                    results.append(AclDeleteResult((), error.code, error.message))
                    continue
                matched = tuple(b for b in current if binding_filter.matches(b))
                removed.update(matched)
                results.append(AclDeleteResult(matched))
            if removed:
                try:
                    self._store({b: None for b in current if b not in removed})
                except OSError as exc:
                    log.exception("Could not store the deletion of %d ACL(s) in %s", len(removed), self.path)
                    message = f"Could not store the ACLs: {exc}"
                    results = [
                        AclDeleteResult((), ErrorCode.UNKNOWN_SERVER_ERROR, message) if r.deleted else r
                        for r in results
                    ]
            return results

    def describe(self, binding_filter: AclBindingFilter) -> list[AclBinding]:
        with self._lock:
            return [b for b in self._current() if binding_filter.matches(b)]
