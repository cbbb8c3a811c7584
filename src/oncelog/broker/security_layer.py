"""The broker's security, built once at start from its config: the listeners with their TLS contexts and SASL
mechanisms, the authorizer, and the stores of SCRAM credentials, ACLs and client quotas (the single node's files
here; a cluster broker's are in ZooKeeper, handed over by cluster mode with `use_cluster_stores` before it serves).

Everything that can be wrong in a security setting (a key store that does not load, a mechanism oncelog does not
offer, a JAAS config without users) is found here, before any log is opened, and ends the start with the key's
name. A connection asks `ListenerRuntime.new_authenticator()` for its state machine; nothing here runs per
request.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import BrokerConfig
from ..security.acl_store import AclStore, AclStoreError, LocalAclStore
from ..security.authorizer import Authorizer, parse_super_users
from ..security.credentials import CredentialStore, LocalCredentialStore, ScramCredential
from ..security.errors import SecurityConfigError
from ..security.jaas import PLAIN_MODULE, SCRAM_MODULE, JaasError, parse_jaas
from ..security.listeners import (
    ListenerError,
    ListenerSettings,
    ListenerSpec,
    inter_broker_listener,
    listener_specs,
)
from ..security.quotas import (
    ClientQuotaManagers,
    ConnectionQuotas,
    LocalQuotaStore,
    QuotaStore,
    QuotaStoreError,
    parse_ip_overrides,
)
from ..security.sasl.authenticator import Authenticator
from ..security.sasl.mechanisms import ExchangeFactory, PlainExchange, ScramExchange
from ..security.tls import PrincipalMapper, TlsConfigError, server_context
from .dynamic_listeners import FILE_NAME as DYNAMIC_FILE
from .dynamic_listeners import DynamicListenerConfigs

log = logging.getLogger("oncelog.security")

OFFERED_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
# Kafka's class names that turn ACLs on; oncelog's authorizer decides as StandardAuthorizer does.
AUTHORIZER_CLASSES = ("org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                      "kafka.security.authorizer.AclAuthorizer")


@dataclass
class ListenerRuntime:
    """One listener as it runs: its spec, settings, TLS context and SASL mechanisms; `port` is the bound one."""

    spec: ListenerSpec
    settings: ListenerSettings
    ssl_context: ssl.SSLContext | None = None
    principal_mapper: PrincipalMapper | None = None
    mechanisms: dict[str, ExchangeFactory] = field(default_factory=dict)
    port: int = 0

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def advertised(self) -> tuple[str, int]:
        """host:port clients of this listener are told (port 0 in the config: the one bound)."""
        return self.spec.advertised_host, self.spec.advertised_port or self.port

    def new_authenticator(self) -> Authenticator | None:
        """The SASL state machine of a new connection; None on a listener without SASL."""
        if not self.spec.sasl:
            return None
        return Authenticator(self.mechanisms, self.settings["sasl.server.max.receive.size"],
                             self.settings["connections.max.reauth.ms"])


def _resolved_overrides(text: str) -> dict[str, int]:
    """max.connections.per.ip.overrides by address: a host name is resolved once, at start (as Kafka's
    InetAddress.getByName when the config is read)."""
    import socket

    overrides = {}
    for host, count in parse_ip_overrides(text).items():
        try:
            address = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0]
        except OSError as exc:
            raise SecurityConfigError(f"max.connections.per.ip.overrides: cannot resolve {host}: {exc}") from None
        overrides[str(address)] = count
    return overrides


class _NotLoadedYet:
    """A cluster broker's credential store until cluster mode hands over ZooKeeper's (before the broker serves)."""

    def get(self, user: str, mechanism: str) -> ScramCredential | None:
        return None

    def describe(self) -> dict[str, list[ScramCredential]]:
        return {}

    def alter(self, upserts: Any, deletions: Any) -> None:
        raise OSError("the credentials are not loaded from ZooKeeper yet")


class BrokerSecurity:
    """The listeners, the authorizer and the stores security keeps: SCRAM credentials, ACLs, client quotas."""

    def __init__(self, config: BrokerConfig, data_dir: Path, listen: tuple[str, int] | None) -> None:
        values = config.values
        self._values = values
        try:
            specs = listener_specs(values, None if values["listeners"] else listen)
            self.inter_broker = inter_broker_listener(values, specs).name
        except ListenerError as exc:
            raise SecurityConfigError(str(exc)) from None
        self.jwks: list[Any] = []  # the OAUTHBEARER listeners' key sets (sasl/oauthbearer.JwksKeys)
        cluster = bool(values["oncelog.coordination.connect"])
        self.credentials: CredentialStore = (
            _NotLoadedYet() if cluster else LocalCredentialStore(data_dir / "__oncelog_meta" / "scram-credentials.json"))
        # listener.name.<l>.ssl.* set through IncrementalAlterConfigs (kept in __oncelog_meta), over the static values
        self.dynamic = DynamicListenerConfigs(data_dir / "__oncelog_meta" / DYNAMIC_FILE, specs, values, cluster)
        self.listeners = [self._runtime(spec, self.dynamic.overlay()) for spec in specs]
        self.dynamic.attach(self.listeners)
        self.cluster = cluster
        # The client side of the inter-broker listener: only a cluster broker connects to other brokers.
        self.inter_broker_security = None
        if self.cluster:
            self.inter_broker_security = self.inter_broker_client()
        self.authorizer: Authorizer | None = None
        self.acl_store: AclStore | None = None
        authorizer_class = values["authorizer.class.name"]
        if authorizer_class:
            if authorizer_class not in AUTHORIZER_CLASSES:
                raise SecurityConfigError(f"authorizer.class.name {authorizer_class}: oncelog's authorizer has the "
                                          f"semantics of {' or '.join(AUTHORIZER_CLASSES)}; name one of them")
            self.authorizer = Authorizer(parse_super_users(values["super.users"]),
                                         values["allow.everyone.if.no.acl.found"])
        if self.authorizer is not None and not cluster:
            try:
                local_acls = LocalAclStore(data_dir / "__oncelog_meta" / "acls.json")
                self.authorizer.update(local_acls.load())
            except AclStoreError as exc:
                raise SecurityConfigError(str(exc)) from None
            local_acls.set_listener(self.authorizer.update)
            self.acl_store = local_acls
        # Client quotas (KIP-13/124/546): the store (AlterClientQuotas writes it, its listener hands every change
        # to the quota managers Produce and Fetch enforce with) and the connection limits of the accept path.
        self.quota_manager = ClientQuotaManagers(values["quota.window.num"], values["quota.window.size.seconds"])
        self.quotas: QuotaStore | None = None
        quota_file = data_dir / "__oncelog_meta" / "quotas.json"
        if cluster:
            for name in ("scram-credentials.json", "acls.json", "quotas.json"):
                if (data_dir / "__oncelog_meta" / name).exists():
                    log.warning("%s is not read by a cluster broker: a cluster keeps its SCRAM credentials, ACLs "
                                "and client quotas in ZooKeeper", data_dir / "__oncelog_meta" / name)
        else:
            try:
                self.quotas = LocalQuotaStore(quota_file)
                self.quota_manager.update(self.quotas.load())
            except QuotaStoreError as exc:
                raise SecurityConfigError(str(exc)) from None
            self.quotas.set_listener(self.quota_manager.update)
        self.connection_quotas = ConnectionQuotas(
            values["max.connections.per.ip"], _resolved_overrides(values["max.connections.per.ip.overrides"]),
            values["max.connection.creation.rate"], values["quota.window.num"], values["quota.window.size.seconds"])

    def use_cluster_stores(self, acls: AclStore | None, credentials: CredentialStore, quotas: QuotaStore) -> None:
        """A cluster broker's stores, read from ZooKeeper (cluster/store/) before it serves: from now on the
        authorizer and the quota managers follow them, every broker's changes included."""
        self.credentials = credentials
        if self.authorizer is not None:
            assert acls is not None
            self.authorizer.update(acls.load())
            acls.set_listener(self.authorizer.update)
            self.acl_store = acls
        self.quota_manager.update(quotas.load())
        quotas.set_listener(self.quota_manager.update)
        self.quotas = quotas

    @property
    def inter_broker_listener(self) -> ListenerRuntime:
        """The listener other brokers reach this one on (inter.broker.listener.name)."""
        return next(lst for lst in self.listeners if lst.name == self.inter_broker)

    def inter_broker_client(self) -> Any:
        """The client side of the inter-broker listener, for this broker's own connections to the others
        (replica fetchers, markers, forwarded requests): its protocol, the listener's trust store (and key store,
        for mutual TLS), ssl.endpoint.identification.algorithm, and the broker's own SASL credential (the
        `username`/`password` of the listener's JAAS config for sasl.mechanism.inter.broker.protocol).
        None for PLAINTEXT, the default."""
        from ..client.config import ClientConfig
        from ..client.security import security_from_config

        listener = self.inter_broker_listener
        settings, protocol = listener.settings, listener.spec.protocol
        if protocol == "PLAINTEXT":
            return None
        # bootstrap.servers only satisfies ClientConfig: each connection names its broker's address itself
        conf: dict[str, Any] = {"bootstrap.servers": f"{listener.advertised[0]}:{listener.advertised[1] or 1}",
                                "security.protocol": protocol}
        if listener.spec.tls:
            for key in ("ssl.truststore.location", "ssl.truststore.certificates", "ssl.keystore.location",
                        "ssl.keystore.certificate.chain", "ssl.keystore.key", "ssl.key.password"):
                if settings[key]:
                    conf[key] = settings[key]
            conf["ssl.truststore.type"] = conf["ssl.keystore.type"] = "PEM"
            conf["ssl.endpoint.identification.algorithm"] = settings["ssl.endpoint.identification.algorithm"] or "none"
        if listener.spec.sasl:
            mechanism = (self._values["sasl.mechanism.inter.broker.protocol"] or "").upper()
            where = f"sasl.mechanism.inter.broker.protocol {mechanism}"
            if mechanism not in listener.mechanisms:
                raise SecurityConfigError(f"{where} is not enabled on the inter-broker listener {listener.name} "
                                          f"({', '.join(listener.mechanisms)})")
            if mechanism not in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
                raise SecurityConfigError(f"{where}: brokers authenticate to each other with PLAIN or SCRAM")
            text = settings.jaas(mechanism) or ""
            options = parse_jaas(text).options if text else {}
            if not options.get("username") or "password" not in options:
                raise SecurityConfigError(f"{where} needs the broker's own credential: username=\"...\" "
                                          f"password=\"...\" in {listener.spec.config_prefix}"
                                          f"{mechanism.lower()}.sasl.jaas.config")
            conf.update({"sasl.mechanism": mechanism, "sasl.username": options["username"],
                         "sasl.password": options["password"]})
        try:
            return security_from_config(ClientConfig(conf, "admin"))
        except ValueError as exc:
            raise SecurityConfigError(f"inter-broker listener {listener.name}: {exc}") from None

    def registration(self) -> dict[str, Any]:
        """What a cluster broker's znode says of its listeners, in Kafka's layout: every endpoint as
        NAME://host:port and each listener's security protocol."""
        return {"endpoints": [f"{lst.name}://{lst.advertised[0]}:{lst.advertised[1]}" for lst in self.listeners],
                "listener_security_protocol_map": {lst.name: lst.spec.protocol for lst in self.listeners}}

    @property
    def secured(self) -> bool:
        return any(lst.spec.protocol != "PLAINTEXT" for lst in self.listeners)

    def _runtime(self, spec: ListenerSpec, values: Mapping[str, Any]) -> ListenerRuntime:
        settings = ListenerSettings(spec, values)
        runtime = ListenerRuntime(spec, settings, port=spec.port)
        if spec.tls:
            try:
                runtime.ssl_context = server_context(settings, spec.name)
                runtime.principal_mapper = PrincipalMapper(settings["ssl.principal.mapping.rules"])
            except TlsConfigError as exc:
                raise SecurityConfigError(str(exc)) from None
        if spec.sasl:
            runtime.mechanisms = self._mechanisms(spec, settings)
        return runtime

    def _mechanisms(self, spec: ListenerSpec, settings: ListenerSettings) -> dict[str, ExchangeFactory]:
        enabled = [m.upper() for m in settings["sasl.enabled.mechanisms"] or []]
        where = f"listener {spec.name}"
        unknown = [m for m in enabled if m not in OFFERED_MECHANISMS]
        if unknown:
            hint = " (GSSAPI is Kafka's default: set sasl.enabled.mechanisms)" if "GSSAPI" in unknown else ""
            raise SecurityConfigError(f"sasl.enabled.mechanisms of {where}: {', '.join(unknown)} not supported; "
                                      f"oncelog offers {', '.join(OFFERED_MECHANISMS)}{hint}")
        if not enabled:
            raise SecurityConfigError(f"sasl.enabled.mechanisms of {where} is empty")
        factories: dict[str, ExchangeFactory] = {}
        for mechanism in enabled:
            key = f"{spec.config_prefix}{mechanism.lower()}.sasl.jaas.config"
            text = settings.jaas(mechanism)
            entry = None
            if text:
                try:
                    entry = parse_jaas(text, key)
                except JaasError as exc:
                    raise SecurityConfigError(str(exc)) from None
            if mechanism == "OAUTHBEARER":
                factories[mechanism] = self._oauthbearer(spec, settings)
                continue
            if mechanism == "PLAIN":
                if entry is None or entry.module != PLAIN_MODULE:
                    raise SecurityConfigError(f"PLAIN on {where} needs {key} = {PLAIN_MODULE} required "
                                              'user_<name>="<password>" ...;')
                users = {k[len("user_"):]: v for k, v in entry.options.items() if k.startswith("user_")}
                if not users:
                    raise SecurityConfigError(f"{key}: no user_<name>=\"<password>\" option, so nobody could log in")
                factories[mechanism] = lambda users=users: PlainExchange(users)
            else:
                if entry is not None and entry.module != SCRAM_MODULE:
                    raise SecurityConfigError(f"{key}: expected {SCRAM_MODULE}, got {entry.module}")
                factories[mechanism] = lambda m=mechanism: ScramExchange(m, self.credentials)
        return factories

    def _oauthbearer(self, spec: ListenerSpec, settings: ListenerSettings) -> ExchangeFactory:
        from ..security.sasl.oauthbearer import JwksError, JwksKeys, OAuthBearerExchange, OAuthSettings

        location = settings["sasl.oauthbearer.jwks.endpoint.url"]
        if not location:
            raise SecurityConfigError(f"OAUTHBEARER on listener {spec.name} needs "
                                      "sasl.oauthbearer.jwks.endpoint.url (oncelog has no unsecured validator)")
        try:
            keys = JwksKeys(location, settings["sasl.oauthbearer.jwks.endpoint.refresh.ms"])
        except JwksError as exc:
            raise SecurityConfigError(str(exc)) from None
        self.jwks.append(keys)
        oauth = OAuthSettings(keys, tuple(settings["sasl.oauthbearer.expected.audience"] or ()),
                              settings["sasl.oauthbearer.expected.issuer"] or None,
                              settings["sasl.oauthbearer.clock.skew.seconds"],
                              settings["sasl.oauthbearer.sub.claim.name"] or "sub",
                              settings["sasl.oauthbearer.scope.claim.name"] or "scope")
        return lambda: OAuthBearerExchange(oauth)

    async def refresh_keys(self) -> None:
        """Read every stale JWKS again, in a thread (a URL may take its time); a failure keeps the old keys."""
        import asyncio

        for keys in self.jwks:
            if keys.stale():
                try:
                    await asyncio.to_thread(keys.refresh)
                except Exception as exc:  # the old key set stays in use
                    log.warning("cannot refresh the JWKS from %s: %s", keys.location, exc)
