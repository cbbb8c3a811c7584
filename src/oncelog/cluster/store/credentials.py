"""A cluster's SCRAM credentials in ZooKeeper, shared by every broker: `ZkCredentialStore`, the `CredentialStore` of
security/credentials.py over the users' config entities (store/entity_configs.py). As Kafka's ZooKeeper era kept
them, a user's credential for a mechanism is a key of /config/users/<user>:

    "SCRAM-SHA-256": "salt=<base64>,stored_key=<base64>,server_key=<base64>,iterations=4096"

`get` and `describe` answer from memory (a SCRAM login reads it: no ZooKeeper round trip per login); `alter` is a
coroutine that writes the users' znodes (one multi-op, with their change notifications) and returns once this
broker holds the change. Another broker has it within a watch round trip.

`put_credential` is the offline way to create a credential before any broker runs (Kafka's `kafka-configs
--zookeeper ... --alter --add-config 'SCRAM-SHA-512=[password=...]' --entity-type users`): a cluster whose brokers
authenticate to each other with SCRAM needs the broker user's credential before they can replicate. It is what
`oncelog coordination scram-credential` runs.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ...security.credentials import MECHANISM_CODES, ScramCredential
from . import znodes
from .entity_configs import Config, EntityConfigs
from .znode_acls import OPEN, ZkSecurity, ensure_path

log = logging.getLogger(__name__)


def credentials_of(config: Config) -> dict[str, ScramCredential]:
    """The SCRAM credentials among a user's config keys (one that cannot be read is left out, logged: that user
    cannot log in with that mechanism, which fails closed)."""
    out = {}
    for mechanism in MECHANISM_CODES:
        text = config.get(mechanism)
        if text is None:
            continue
        try:
            out[mechanism] = znodes.scram_from(mechanism, text)
        except ValueError as exc:
            log.warning("ignoring an unreadable %s credential: %s", mechanism, exc)
    return out


class ZkCredentialStore:
    """SCRAM credentials in the users' config entities (see the module docstring)."""

    def __init__(self, configs: EntityConfigs) -> None:
        self.configs = configs
        self._users: dict[str, dict[str, ScramCredential]] = {}
        configs.subscribe(self._changed)
        self._changed(set(configs.configs))

    def _changed(self, paths: set[str]) -> None:
        for path in paths:
            user = znodes.entity_user(path)
            if user is None:
                continue
            credentials = credentials_of(self.configs.configs.get(path, {}))
            if credentials:
                self._users[user] = credentials
            else:
                self._users.pop(user, None)

    def get(self, user: str, mechanism: str) -> ScramCredential | None:
        return self._users.get(user, {}).get(mechanism)

    def describe(self) -> dict[str, list[ScramCredential]]:
        return {user: sorted(mechs.values(), key=lambda c: MECHANISM_CODES[c.mechanism])
                for user, mechs in self._users.items() if mechs}

    async def alter(self, upserts: Sequence[tuple[str, ScramCredential]],
                    deletions: Sequence[tuple[str, str]]) -> None:
        """Delete then upsert, every user in one multi-op (NotStored, an OSError, when it could not be stored:
        nothing changed)."""
        by_user: dict[str, tuple[list[str], list[ScramCredential]]] = {}
        for user, mechanism in deletions:
            by_user.setdefault(user, ([], []))[0].append(mechanism)
        for user, credential in upserts:
            by_user.setdefault(user, ([], []))[1].append(credential)

        def edit(removed: list[str], added: list[ScramCredential]):
            def apply(config: Config) -> Config:
                for mechanism in removed:
                    config.pop(mechanism, None)
                for credential in added:
                    config[credential.mechanism] = znodes.scram_text(credential)
                return config
            return apply

        await self.configs.alter({znodes.user_entity(user): edit(*change) for user, change in by_user.items()},
                                 "SCRAM credentials")


def put_credential(connect: str, user: str, credential: ScramCredential, timeout_s: float = 30.0,
                   security: ZkSecurity = OPEN) -> None:
    """Create or replace `user`'s credential in the cluster whose brokers take `connect` (their
    oncelog.coordination.connect, chroot included; without one, the brokers' default chroot), with its change
    notification: brokers running already take it at once, brokers started later read it at start. Blocking (a
    command-line tool's, not a broker's). `security`: the brokers' ZooKeeper login and whether znodes get ACLs
    (store/znode_acls.py), so what it creates is the brokers' as if they had. Raises NotStored when it could not
    be stored."""
    from kazoo.client import KazooClient
    from kazoo.exceptions import (
        AuthFailedError,
        BadVersionError,
        KazooException,
        NodeExistsError,
        NoNodeError,
    )
    from kazoo.handlers.threading import KazooTimeoutError

    from ..connect import parse_connect
    from .errors import NotStored
    from .notifications import MAX_UPDATE_RETRIES

    parsed = parse_connect(connect)
    root = (parsed.chroot or znodes.DEFAULT_CHROOT).rstrip("/")
    path = f"{root}{znodes.entity_znode(znodes.user_entity(user))}"
    client = KazooClient(hosts=parsed.servers, timeout=timeout_s, **security.client_kwargs())

    def acls(full: str) -> list:
        return security.acls(full[len(root):] if full == root or full.startswith(root + "/") else full)

    try:
        client.start(timeout=timeout_s)
        for rel in (znodes.CONFIG_USERS, znodes.CONFIG_CHANGES):
            ensure_path(client, root + rel, acls)
        for _ in range(MAX_UPDATE_RETRIES):
            try:
                data, stat = client.get(path)
                exists, version = True, stat.version
            except NoNodeError:
                data, exists, version = b"", False, -1
            config = znodes.config_from(data)
            config[credential.mechanism] = znodes.scram_text(credential)
            txn = client.transaction()
            if exists:
                txn.set_data(path, znodes.config_json(config), version)
            else:
                txn.create(path, znodes.config_json(config), acls(path))
            notice = f"{root}{znodes.CONFIG_CHANGES}/{znodes.CONFIG_CHANGE_PREFIX}"
            txn.create(notice, znodes.config_change_json(znodes.user_entity(user)), acls(notice), sequence=True)
            results = txn.commit()
            failures = [r for r in results if isinstance(r, Exception)]
            if not failures:
                return
            if not any(isinstance(r, (BadVersionError, NodeExistsError, NoNodeError)) for r in failures):
                raise NotStored(f"could not store the credential: {failures[0]!r}")
        raise NotStored(f"could not store the credential: {path} changed under {MAX_UPDATE_RETRIES} attempts")
    except AuthFailedError:
        raise NotStored(f"ZooKeeper at {parsed.servers} refused the login of {security.describe()}: "
                        "authentication failed") from None
    except KazooException as exc:
        raise NotStored(f"could not store the credential in ZooKeeper at {connect}: {exc!r}") from exc
    except KazooTimeoutError as exc:
        raise NotStored(f"no ZooKeeper session with {parsed.servers} after {timeout_s:.0f}s") from exc
    finally:
        client.stop()
        client.close()
