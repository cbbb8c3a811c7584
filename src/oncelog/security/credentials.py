"""SCRAM credentials: salted, never a password (RFC 5802 §3; Kafka's `ScramCredential`).

What is kept per user and mechanism is the salt, the iteration count, StoredKey = H(HMAC(SaltedPassword,
"Client Key")) and ServerKey = HMAC(SaltedPassword, "Server Key"): enough to check a client's proof and to
prove the server to it, not enough to log in. KIP-554's AlterUserScramCredentials sends the salted password
(the client salts), so a password never reaches the broker over the wire either. The single node keeps them in
one file written atomically (they must survive a SIGKILL); a cluster keeps them in ZooKeeper behind the same
protocol.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..durable_file import atomic_write

# KIP-554's ScramMechanism codes, and Kafka's bounds on the iteration count (ScramMechanism.java).
MECHANISM_CODES = {"SCRAM-SHA-256": 1, "SCRAM-SHA-512": 2}
MECHANISM_NAMES = {code: name for name, code in MECHANISM_CODES.items()}
_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384


@dataclass(frozen=True)
class ScramCredential:
    mechanism: str
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def __repr__(self) -> str:
        return f"ScramCredential({self.mechanism}, iterations={self.iterations})"

    def to_json(self) -> dict[str, object]:
        b64 = base64.b64encode
        return {"salt": b64(self.salt).decode(), "stored_key": b64(self.stored_key).decode(),
                "server_key": b64(self.server_key).decode(), "iterations": self.iterations}

    @classmethod
    def from_json(cls, mechanism: str, data: dict) -> ScramCredential:
        b64 = base64.b64decode
        return cls(mechanism, b64(data["salt"]), b64(data["stored_key"]), b64(data["server_key"]),
                   int(data["iterations"]))


def from_salted_password(mechanism: str, salt: bytes, salted_password: bytes, iterations: int) -> ScramCredential:
    """The credential KIP-554 upserts: the client sent SaltedPassword = Hi(password, salt, iterations)."""
    digest = _HASHES[mechanism]
    client_key = hmac.new(salted_password, b"Client Key", digest).digest()
    stored_key = hashlib.new(digest, client_key).digest()
    server_key = hmac.new(salted_password, b"Server Key", digest).digest()
    return ScramCredential(mechanism, salt, stored_key, server_key, iterations)


def from_password(mechanism: str, password: str, iterations: int = MIN_ITERATIONS,
                  salt: bytes | None = None) -> ScramCredential:
    """For tools that take a password (the offline `oncelog users` command): scramp salts and derives."""
    from scramp import ScramMechanism

    salt_out, stored_key, server_key, count = ScramMechanism(mechanism).make_auth_info(
        password, iteration_count=iterations, salt=salt)
    return ScramCredential(mechanism, bytes(salt_out), stored_key, server_key, count)


class CredentialStore(Protocol):
    """Where SCRAM credentials live: a file on the single node, znodes in a cluster (cluster/store/credentials.py).

    `get` and `describe` answer at once, from memory (a login reads it). `alter` stores deletions then upserts,
    all or none, at once (the file) or as a coroutine (ZooKeeper; callers take either with
    `security.settled.settled`), and raises OSError when they could not be stored."""

    def get(self, user: str, mechanism: str) -> ScramCredential | None: ...

    def describe(self) -> dict[str, list[ScramCredential]]: ...

    def alter(self, upserts: Sequence[tuple[str, ScramCredential]],
              deletions: Sequence[tuple[str, str]]) -> None | Awaitable[None]: ...


class LocalCredentialStore:
    """`scram-credentials.json` in the data directory's `__oncelog_meta`: {user: {mechanism: credential}}."""

    def __init__(self, path: Path, on_change: Callable[[], None] | None = None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._users: dict[str, dict[str, ScramCredential]] = {}
        self._on_change = on_change
        self.load()

    def load(self) -> None:
        if not self.path.exists():
            self._users = {}
            return
        raw = json.loads(self.path.read_text())
        self._users = {user: {mech: ScramCredential.from_json(mech, data) for mech, data in mechs.items()}
                       for user, mechs in raw.get("users", {}).items()}

    def get(self, user: str, mechanism: str) -> ScramCredential | None:
        return self._users.get(user, {}).get(mechanism)

    def describe(self) -> dict[str, list[ScramCredential]]:
        return {user: sorted(mechs.values(), key=lambda c: MECHANISM_CODES[c.mechanism])
                for user, mechs in self._users.items() if mechs}

    def alter(self, upserts: Sequence[tuple[str, ScramCredential]], deletions: Sequence[tuple[str, str]]) -> None:
        with self._lock:
            users = {user: dict(mechs) for user, mechs in self._users.items()}
            for user, mechanism in deletions:
                users.get(user, {}).pop(mechanism, None)
            for user, credential in upserts:
                users.setdefault(user, {})[credential.mechanism] = credential
            users = {user: mechs for user, mechs in users.items() if mechs}
            os.makedirs(self.path.parent, exist_ok=True)
            data = {"version": 1, "users": {user: {m: c.to_json() for m, c in mechs.items()}
                                            for user, mechs in users.items()}}
            atomic_write(self.path, json.dumps(data, indent=1, sort_keys=True).encode())
            self._users = users
        if self._on_change is not None:
            self._on_change()
