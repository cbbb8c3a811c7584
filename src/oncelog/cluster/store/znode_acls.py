"""Who may change the znodes: ZooKeeper credentials and the ACLs every znode is created with (docs/security.md §9).

As Kafka's ZooKeeper era did it (ZkData.defaultAcls, KafkaServer's check, JaasUtils):

- Credentials come from the `Client` section (`zookeeper.sasl.clientconfig`) of the JAAS file named by
  `java.security.auth.login.config` (a broker key here, there being no JVM; `-Djava.security.auth.login.config=F`
  in KAFKA_OPTS is read too), a `org.apache.zookeeper.server.auth.DigestLoginModule` with `username` and
  `password`: the session authenticates with SASL DIGEST-MD5 and ZooKeeper knows it as `sasl:<username>`. SASL is
  on unless `zookeeper.sasl.client=false`; a Client section with SASL turned off is refused, as JaasUtils refuses it.
- With `zookeeper.set.acl=true` every znode created gets the creator (the broker's SASL identity) all permissions
  and everyone READ, except under the sensitive roots (SCRAM credentials and quotas under /config/users,
  /config/brokers, /delegation_token), where nobody else gets anything. Without it znodes are open, SASL or not.
- `zookeeper.set.acl=true` without credentials refuses to start (Kafka: "zookeeper.set.acl is true, but ... the
  verification of the JAAS login file failed"); credentials ZooKeeper refuses stop the start too (StoreSession).

`acls_for` is the one place that decides a znode's ACL; every create of cluster/store/ asks it, through
`StoreSession.acls` (chroot-relative paths) or `ZkSecurity.acls`.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kazoo.security import ACL, CREATOR_ALL_ACL, OPEN_ACL_UNSAFE, READ_ACL_UNSAFE

from ...security.jaas import JaasError, parse_jaas_file
from .errors import ZkAuthError

DIGEST_MODULE = "org.apache.zookeeper.server.auth.DigestLoginModule"
DEFAULT_CONTEXT = "Client"
LOGIN_CONFIG_KEY = "java.security.auth.login.config"
SASL_CLIENT_KEY = "zookeeper.sasl.client"
CONTEXT_KEY = "zookeeper.sasl.clientconfig"
SET_ACL_KEY = "zookeeper.set.acl"
KEYS = (SET_ACL_KEY, LOGIN_CONFIG_KEY, SASL_CLIENT_KEY, CONTEXT_KEY)   # the broker keys zk_security reads

# ZkData.SensitiveRootPaths, chroot-relative; matched as Kafka matches them (a string prefix).
SENSITIVE_ROOTS = ("/config/users", "/config/brokers", "/delegation_token")


def sensitive(path: str) -> bool:
    """Whether `path` (chroot-relative) is under a root nobody but the brokers may read."""
    return any(path.startswith(root) for root in SENSITIVE_ROOTS)


def acls_for(path: str, secure: bool) -> list[ACL]:
    """The ACL a znode at `path` (chroot-relative) is created with: open without `secure` (zookeeper.set.acl),
    else the creator's identity all permissions, plus everyone READ outside the sensitive roots."""
    if not secure:
        return list(OPEN_ACL_UNSAFE)
    return list(CREATOR_ALL_ACL) + ([] if sensitive(path) else list(READ_ACL_UNSAFE))


@dataclass(frozen=True)
class ZkCredentials:
    """A SASL DIGEST-MD5 login to ZooKeeper, and where it was read (for messages: never the password)."""

    username: str
    password: str = field(repr=False)
    source: str = ""

    def sasl_options(self) -> dict[str, str]:
        """kazoo's `sasl_options` (pure-sasl's DIGEST-MD5)."""
        return {"mechanism": "DIGEST-MD5", "username": self.username, "password": self.password}


@dataclass(frozen=True)
class ZkSecurity:
    """How a broker's (or a tool's) kazoo clients authenticate, and whether the znodes they create get ACLs."""

    credentials: ZkCredentials | None = None
    set_acl: bool = False

    def acls(self, path: str) -> list[ACL]:
        return acls_for(path, self.set_acl)

    def client_kwargs(self) -> dict[str, Any]:
        """What a KazooClient takes for these credentials (nothing without them)."""
        return {} if self.credentials is None else {"sasl_options": self.credentials.sasl_options()}

    def describe(self) -> str:
        if self.credentials is None:
            return "unauthenticated"
        return f"SASL user {self.credentials.username!r} ({self.credentials.source})"


OPEN = ZkSecurity()


def _jvm_properties(kafka_opts: str) -> dict[str, str]:
    """The `-Dname=value` properties of a KAFKA_OPTS value."""
    try:
        words = shlex.split(kafka_opts)
    except ValueError:
        words = kafka_opts.split()
    out = {}
    for word in words:
        if word.startswith("-D") and "=" in word:
            name, _, value = word[2:].partition("=")
            out[name] = value
    return out


def _flag(value: Any) -> bool:
    return value if isinstance(value, bool) else str(value).strip().lower() == "true"


def zk_security(settings: Mapping[str, Any], environ: Mapping[str, str] | None = None,
                read: Callable[[str], str] | None = None) -> ZkSecurity:
    """The ZooKeeper security of a broker's settings (server.properties keys; KAFKA_OPTS's -D properties of
    `environ` fill the three JVM properties left unset). ZkAuthError, naming the keys and the file, when it cannot
    be honoured: `zookeeper.set.acl=true` without credentials, a JAAS file that cannot be read or has no usable
    DigestLoginModule in its section, a section present with zookeeper.sasl.client=false."""
    jvm = _jvm_properties((environ or {}).get("KAFKA_OPTS", ""))

    def setting(key: str, default: str) -> Any:
        value = settings.get(key)
        if value is None or value == "":
            return jvm.get(key, default)
        return value

    set_acl = _flag(settings.get(SET_ACL_KEY, False))
    login_file = str(setting(LOGIN_CONFIG_KEY, "")).strip()
    sasl_on = _flag(setting(SASL_CLIENT_KEY, "true"))
    context = str(setting(CONTEXT_KEY, DEFAULT_CONTEXT)).strip() or DEFAULT_CONTEXT
    where = f"[{LOGIN_CONFIG_KEY}={login_file or None}, {SASL_CLIENT_KEY}={str(sasl_on).lower()}, {CONTEXT_KEY}={context}]"

    credentials = None
    if login_file:
        reader = read or (lambda path: open(path, encoding="utf-8").read())  # noqa: SIM115 - read whole
        try:
            sections = parse_jaas_file(reader(login_file), login_file)
        except OSError as exc:
            raise ZkAuthError(f"cannot read the JAAS file {login_file} ({LOGIN_CONFIG_KEY}): "
                              f"{exc.strerror or exc}") from None
        except JaasError as exc:
            raise ZkAuthError(str(exc)) from None
        entries = sections.get(context)
        if entries is not None and not sasl_on:
            raise ZkAuthError(f"the JAAS file {login_file} has a {context} section, but {SASL_CLIENT_KEY} is false, "
                              f"which turns SASL to ZooKeeper off: remove one of them {where}")
        if entries is not None:
            credentials = _digest_credentials(entries, f"{login_file}, section {context}")
    if set_acl and credentials is None:
        raise ZkAuthError(f"{SET_ACL_KEY} is true, but no ZooKeeper credentials were found: a JAAS file with a "
                          f"{context} section ({DIGEST_MODULE} username=... password=...) is needed {where}")
    return ZkSecurity(credentials, set_acl)


def _digest_credentials(entries: list[Any], source: str) -> ZkCredentials:
    for entry in entries:
        if entry.module == DIGEST_MODULE:
            username, password = entry.options.get("username"), entry.options.get("password")
            if not username or password is None:
                raise ZkAuthError(f"{source}: {DIGEST_MODULE} needs username=\"...\" and password=\"...\"")
            return ZkCredentials(username, password, source)
    modules = ", ".join(entry.module for entry in entries) or "none"
    raise ZkAuthError(f"{source}: no {DIGEST_MODULE} (found: {modules}); only SASL DIGEST-MD5 logins to "
                      "ZooKeeper are supported (no Kerberos)")


def ensure_path(client: Any, path: str, acls: Callable[[str], list[ACL]]) -> None:
    """Create `path` and any missing parent with a started KazooClient (blocking), each with its own ACL
    (Kafka's createRecursive; kazoo's ensure_path would give every parent the leaf's). Asks whether it exists
    first, as kazoo's does (see StoreSession.ensure_path, the same on the loop)."""
    from kazoo.exceptions import NodeExistsError, NoNodeError

    if path in ("", "/") or client.exists(path) is not None:
        return
    try:
        client.create(path, b"", acl=acls(path))
    except NodeExistsError:
        pass
    except NoNodeError:
        ensure_path(client, path.rsplit("/", 1)[0], acls)
        try:
            client.create(path, b"", acl=acls(path))
        except NodeExistsError:
            pass
