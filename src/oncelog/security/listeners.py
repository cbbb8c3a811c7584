"""The broker's listeners as Kafka configures them, validated once at start.

`listeners=CLIENT://0.0.0.0:9093,BROKER://127.0.0.1:9094` names each listener; its security protocol comes
from `listener.security.protocol.map` (a listener named after a protocol needs no entry). Settings that differ
per listener are given as `listener.name.<lower-case name>.<key>` and win over `<key>` for that listener, so
one file can run a SASL_SSL client listener beside an mTLS broker listener. Everything a Kafka broker refuses
here (a name twice, a port twice, an unmapped name, `inter.broker.listener.name` together with
`security.inter.broker.protocol`) is refused with the key's name, before any log is opened.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
DEFAULT_PROTOCOL_MAP = ",".join(f"{p}:{p}" for p in PROTOCOLS)

# The keys a `listener.name.<name>.` prefix may override (Kafka's listener-configurable ssl/sasl keys, plus the
# per-mechanism JAAS configs, which exist only in that form on a broker).
LISTENER_KEYS = (
    "ssl.keystore.type", "ssl.keystore.location", "ssl.keystore.password", "ssl.keystore.certificate.chain",
    "ssl.keystore.key", "ssl.key.password", "ssl.truststore.type", "ssl.truststore.location",
    "ssl.truststore.password", "ssl.truststore.certificates", "ssl.client.auth", "ssl.principal.mapping.rules",
    "ssl.allow.dn.changes", "ssl.allow.san.changes",
    "ssl.enabled.protocols", "ssl.protocol", "ssl.cipher.suites", "ssl.endpoint.identification.algorithm",
    "sasl.enabled.mechanisms", "connections.max.reauth.ms", "sasl.server.max.receive.size",
    "sasl.oauthbearer.jwks.endpoint.url", "sasl.oauthbearer.jwks.endpoint.refresh.ms",
    "sasl.oauthbearer.expected.audience",
    "sasl.oauthbearer.expected.issuer", "sasl.oauthbearer.clock.skew.seconds",
    "sasl.oauthbearer.sub.claim.name", "sasl.oauthbearer.scope.claim.name",
)
JAAS_MECHANISMS = ("plain", "scram-sha-256", "scram-sha-512", "oauthbearer")
_PREFIXED = re.compile(r"^listener\.name\.([a-z0-9_]+)\.(.+)$")
_LISTENER = re.compile(r"^([A-Za-z0-9_]+)://(\[[0-9a-fA-F:.]*\]|[^:\[\]]*):(\d+)$")


class ListenerError(ValueError):
    """A listener setting the broker refuses; the message names the key."""


@dataclass(frozen=True)
class ListenerSpec:
    """One listener: where it binds, what it tells clients, and how it secures its connections."""

    name: str  # upper case, as Kafka normalizes it
    host: str
    port: int
    protocol: str
    advertised_host: str
    advertised_port: int

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @property
    def config_prefix(self) -> str:
        return f"listener.name.{self.name.lower()}."


def split_listener_key(name: str) -> tuple[str, str] | None:
    """("client", "ssl.keystore.location") for `listener.name.client.ssl.keystore.location`; None if `name` is
    not a listener override. The key part is checked by the caller against LISTENER_KEYS and the JAAS forms."""
    match = _PREFIXED.match(name)
    return (match.group(1), match.group(2)) if match else None


def is_listener_key(key: str) -> bool:
    """Whether `key` (without the prefix) may follow `listener.name.<name>.`."""
    if key in LISTENER_KEYS:
        return True
    mechanism, _, rest = key.partition(".")
    return rest == "sasl.jaas.config" and mechanism in JAAS_MECHANISMS


def parse_protocol_map(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, protocol = item.partition(":")
        if not sep or not name or protocol.upper() not in PROTOCOLS:
            raise ListenerError(f"Invalid value {text!r} for configuration listener.security.protocol.map: "
                                f"expected NAME:PROTOCOL pairs with PROTOCOL one of {', '.join(PROTOCOLS)}")
        if name.upper() in out:
            raise ListenerError(f"listener.security.protocol.map names {name.upper()} twice")
        out[name.upper()] = protocol.upper()
    return out


def _parse_addresses(text: str, key: str) -> list[tuple[str, str, int]]:
    out = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        match = _LISTENER.match(item)
        if match is None:
            raise ListenerError(f"Invalid value {item!r} in configuration {key}: expected NAME://HOST:PORT")
        host = match.group(2).strip("[]")
        port = int(match.group(3))
        if port > 65535:
            raise ListenerError(f"Invalid port {port} in configuration {key}")
        out.append((match.group(1).upper(), host, port))
    names = [name for name, _, _ in out]
    if len(set(names)) != len(names):
        raise ListenerError(f"Each listener must have a different name in configuration {key}: {text!r}")
    return out


def listener_specs(values: Mapping[str, Any], listen: tuple[str, int] | None = None) -> list[ListenerSpec]:
    """The broker's listeners, first one first (the default listener clients reach when nothing else says).

    `listen` is `oncelog serve --listen` (or an embedded broker's host and port): one PLAINTEXT listener, the
    shortcut that keeps `make run` and every embedded broker as they were; it is refused together with
    `listeners`."""
    protocol_map = parse_protocol_map(values.get("listener.security.protocol.map") or DEFAULT_PROTOCOL_MAP)
    configured = values.get("listeners") or ""
    if configured and listen is not None:
        raise ListenerError("listeners is set in the configuration and --listen was given: use one of them")
    if configured:
        bound = _parse_addresses(configured, "listeners")
    else:
        host, port = listen if listen is not None else ("127.0.0.1", 9092)
        bound = [("PLAINTEXT", host, port)]
        protocol_map.setdefault("PLAINTEXT", "PLAINTEXT")
    ports = [port for _, _, port in bound if port]
    if len(set(ports)) != len(ports):
        raise ListenerError(f"Each listener must have a different port in configuration listeners: {configured!r}")
    advertised: dict[str, tuple[str, int]] = {}
    text = (values.get("advertised.listeners") or "").strip()
    if text and "://" not in text:
        # oncelog's earlier form: one host:port for the only listener
        host, _, port = text.rpartition(":")
        if not port.isdigit() or len(bound) != 1:
            raise ListenerError(f"Invalid value {text!r} for configuration advertised.listeners: "
                                "expected NAME://HOST:PORT entries")
        advertised[bound[0][0]] = (host, int(port))
    elif text:
        known = {name for name, _, _ in bound}
        for name, host, port in _parse_addresses(text, "advertised.listeners"):
            if name not in known:
                raise ListenerError(f"advertised.listeners names {name}, which is not in listeners")
            advertised[name] = (host, port)
    specs = []
    for name, host, port in bound:
        protocol = protocol_map.get(name)
        if protocol is None:
            raise ListenerError(f"No security protocol defined for listener {name} "
                                "(add it to listener.security.protocol.map)")
        adv_host, adv_port = advertised.get(name, (host, port))
        specs.append(ListenerSpec(name, host, port, protocol, adv_host, adv_port))
    return specs


def inter_broker_listener(values: Mapping[str, Any], specs: list[ListenerSpec]) -> ListenerSpec:
    """The listener other brokers use to reach this one: `inter.broker.listener.name`, or the first listener of
    `security.inter.broker.protocol` (default PLAINTEXT); both set is refused, as Kafka does."""
    name = values.get("inter.broker.listener.name") or ""
    protocol = values.get("security.inter.broker.protocol") or ""
    if name and protocol:
        raise ListenerError("Only one of inter.broker.listener.name and security.inter.broker.protocol should be set")
    if name:
        for spec in specs:
            if spec.name == name.upper():
                return spec
        raise ListenerError(f"inter.broker.listener.name must be a listener name defined in listeners: {name}")
    wanted = (protocol or "PLAINTEXT").upper()
    if wanted not in PROTOCOLS:
        raise ListenerError(f"Invalid value {protocol!r} for configuration security.inter.broker.protocol")
    for spec in specs:
        if spec.name == wanted:
            return spec
    if protocol or len(specs) > 1:
        raise ListenerError(f"security.inter.broker.protocol {wanted}: no listener named {wanted} in listeners "
                            "(set inter.broker.listener.name)")
    return specs[0]


class ListenerSettings:
    """The settings of one listener: `listener.name.<name>.<key>` when given, else the broker's `<key>`."""

    def __init__(self, spec: ListenerSpec, values: Mapping[str, Any]) -> None:
        self.spec = spec
        self._values = values

    def __getitem__(self, key: str) -> Any:
        prefixed = self.spec.config_prefix + key
        if prefixed in self._values:
            return self._values[prefixed]
        return self._values.get(key)

    def jaas(self, mechanism: str) -> str | None:
        """The listener's JAAS config for `mechanism` (only the prefixed form exists on a broker)."""
        return self._values.get(f"{self.spec.config_prefix}{mechanism.lower()}.sasl.jaas.config")
