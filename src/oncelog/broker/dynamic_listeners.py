"""Dynamic per-listener SSL configs: a listener's key store and trust store replaced at run time.

Kafka lets `kafka-configs --entity-type brokers --entity-name <id> --alter --add-config
listener.name.<listener>.ssl.keystore.location=<file>` replace a listener's key store without a restart
(DynamicBrokerConfig's DynamicSecurityConfigs, SslConfigs.RECONFIGURABLE_CONFIGS). Exactly those keys are dynamic
here, and only in their `listener.name.<listener>.` form, per broker (not at the cluster-default level), as Kafka
requires; every other broker key stays static.

A change is checked as Kafka's SslFactory checks it, before anything changes: the listener's new context is built
with `security/tls.server_context` from the static settings with the dynamic values over them (a key store that does
not load is refused with the reason); its certificate keeps the old one's distinguished name and subject alternative
names unless `ssl.allow.dn.changes` / `ssl.allow.san.changes`; a trust store is not added to a listener that had none.
Then the change is written to `__oncelog_meta/dynamic-broker-configs.json` (atomically, owner-only: the PEM key and
passwords are in it, as they are in Kafka's metadata log) and the new context is put in service. Setting a
`*.location` key to the value it has reloads the file, as Kafka reloads a key store changed in place. At start the
file's values are applied over server.properties (a value that no longer loads stops the start, naming the file).

Putting a context in service: asyncio's server keeps the SSLContext it was created with, so that context (the
listener's `ssl_context`) stays the front door and its SNI callback, which OpenSSL calls on every ClientHello (with or
without a server name), moves the connection to the listener's current context (`SSLObject.context`, OpenSSL's
SSL_set_SSL_CTX) before the server's certificate is chosen. A handshake whose ClientHello arrives after the change
gets the new certificate and trust store; a connection already past its ClientHello keeps the context it had, as
Kafka's connections keep their SSLEngine. Protocol versions, ciphers and ssl.client.auth are not dynamic and stay the
front context's.

A cluster broker refuses these changes for now: its dynamic configs would have to be kept in ZooKeeper for the
controller and every broker to see them.
"""

from __future__ import annotations

import json
import logging
import os
import ssl
from collections import ChainMap
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import BROKER_KEYS, ConfigError
from ..durable_file import atomic_write
from ..errors import ErrorCode, KafkaError
from ..security.errors import SecurityConfigError
from ..security.listeners import ListenerSettings, ListenerSpec, split_listener_key
from ..security.tls import TlsConfigError, server_context

log = logging.getLogger("oncelog.security")

# SslConfigs.RECONFIGURABLE_CONFIGS: the keys Kafka reconfigures on a running listener.
DYNAMIC_SSL_KEYS = (
    "ssl.keystore.type", "ssl.keystore.location", "ssl.keystore.password", "ssl.key.password",
    "ssl.truststore.type", "ssl.truststore.location", "ssl.truststore.password",
    "ssl.keystore.certificate.chain", "ssl.keystore.key", "ssl.truststore.certificates",
)
_RELOADED_FILES = ("ssl.keystore.location", "ssl.truststore.location")
FILE_NAME = "dynamic-broker-configs.json"
OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3
NOT_IN_A_CLUSTER = ("dynamic listener SSL configs are not supported on a cluster broker yet (they would have to be "
                    "kept in ZooKeeper for every broker): set {name} in server.properties and restart the broker")


def dynamic_listener_key(name: str) -> tuple[str, str] | None:
    """("ssl", "ssl.keystore.location") for `listener.name.ssl.ssl.keystore.location`; None unless `name` is one of
    the dynamic per-listener SSL keys."""
    split = split_listener_key(name)
    return split if split is not None and split[1] in DYNAMIC_SSL_KEYS else None


def check_broker_change(name: str, op: int, resource_name: str) -> bool:
    """Whether `name` is a dynamic key (True) or not (False: the caller answers as for a static key). Raises the
    KafkaError Kafka's preprocessing answers for a change of a dynamic key it refuses before authorization."""
    if name in DYNAMIC_SSL_KEYS:
        raise KafkaError(ErrorCode.INVALID_REQUEST, "These security configs can be dynamically updated only "
                                                    f"per-listener using the listener prefix: {name}")
    if dynamic_listener_key(name) is None:
        return False
    if resource_name == "":
        raise KafkaError(ErrorCode.INVALID_REQUEST, "Cannot update these configs at default cluster level, broker id "
                                                    f"must be specified: {name}")
    if op in (OP_APPEND, OP_SUBTRACT):
        raise KafkaError(ErrorCode.INVALID_CONFIG, f"Config value append/subtract is not allowed for config key: "
                                                   f"{name}")
    return True


@dataclass
class _Plan:
    values: dict[str, str]  # the new dynamic values (raw text)
    contexts: dict[str, ssl.SSLContext]  # listener name -> its new context
    settings: dict[str, ListenerSettings]
    certificates: dict[str, Any]


class DynamicListenerConfigs:
    """The broker's dynamic listener SSL values, the file that keeps them, and each TLS listener's current context."""

    def __init__(self, path: Path, specs: list[ListenerSpec], static: Mapping[str, Any], cluster: bool) -> None:
        self.path = path
        self.cluster = cluster
        self._static = static
        self._specs = {spec.name.lower(): spec for spec in specs}
        self.values: dict[str, str] = {}  # as set, text (DescribeConfigs shows these)
        self._current: dict[str, ssl.SSLContext] = {}  # listener name -> the context new handshakes get
        self._listeners: dict[str, Any] = {}  # listener name -> security_layer.ListenerRuntime, once attached
        # listener name -> the certificate its current context serves, read when that context was built (a key
        # store changed in place and reloaded is compared with what was served, not with the file's new content)
        self._certificates: dict[str, Any] = {}
        if cluster:
            if path.exists():
                log.warning("%s is not read by a cluster broker: dynamic listener configs are not supported in a "
                            "cluster yet", path)
            return
        self.values = self._load()
        dynamic = {split[0] for split in map(dynamic_listener_key, self.values) if split is not None}
        for listener, spec in self._specs.items():
            if not spec.tls:
                continue
            settings = ListenerSettings(spec, self.overlay())
            if listener in dynamic:
                try:
                    server_context(settings, spec.name)
                except TlsConfigError as exc:

                    raise SecurityConfigError(f"{exc} (a dynamic config, set through IncrementalAlterConfigs and "
                                              f"kept in {path}: fix what it names, or remove the key from that "
                                              "file)") from None
            self._certificates[listener] = _leaf(settings)

    def _load(self) -> dict[str, str]:
        if not self.path.exists():
            return {}
        try:
            data = json.loads(self.path.read_text())
            raw = data["configs"]
            if not isinstance(raw, dict):
                raise ValueError("configs is not an object")
        except (OSError, ValueError, KeyError, TypeError) as exc:

            raise SecurityConfigError(f"{self.path}: cannot read the dynamic broker configs: {exc}") from None
        values = {}
        for name, value in raw.items():
            split = dynamic_listener_key(name)
            spec = self._specs.get(split[0]) if split is not None else None
            if split is None or spec is None or not spec.tls or not isinstance(value, str):
                log.warning("%s: ignoring %s, which is not a dynamic SSL config of a TLS listener of this broker",
                            self.path, name)
                continue
            try:
                BROKER_KEYS[split[1]].parse(value)
            except ConfigError as exc:
                log.warning("%s: ignoring %s: %s", self.path, name, exc)
                continue
            values[name] = value
        if values:
            log.info("dynamic broker configs from %s over the static ones: %s", self.path, ", ".join(sorted(values)))
        return values

    def overlay(self, values: dict[str, str] | None = None) -> Mapping[str, Any]:
        """The broker's settings with the dynamic values (parsed as the static ones are) over them."""
        parsed = {name: BROKER_KEYS[name.split(".", 3)[3]].parse(value)
                  for name, value in (self.values if values is None else values).items()}
        return ChainMap(parsed, self._static) if parsed else self._static

    def attach(self, listeners: list[Any]) -> None:
        """The broker's running listeners (security_layer.ListenerRuntime), whose contexts a change replaces."""
        self._listeners = {lst.name.lower(): lst for lst in listeners}

    # -- a change ---------------------------------------------------------------------------------------------
    def prepare(self, changes: list[tuple[str, int, str | None]]) -> _Plan:
        """Check `changes` ((name, op, value) of dynamic keys only) as a whole, build the new contexts; change
        nothing. KafkaError(INVALID_REQUEST, why) when they cannot be applied."""
        if self.cluster:
            raise KafkaError(ErrorCode.INVALID_REQUEST, NOT_IN_A_CLUSTER.format(name=changes[0][0]))
        values = dict(self.values)
        touched: set[str] = set()
        for name, op, value in changes:
            listener, key = dynamic_listener_key(name)  # type: ignore[misc]
            spec = self._specs.get(listener)
            if spec is None:
                raise KafkaError(ErrorCode.INVALID_REQUEST, f"{name}: this broker has no listener named "
                                                            f"{listener.upper()}")
            if not spec.tls:
                raise KafkaError(ErrorCode.INVALID_REQUEST, f"{name}: listener {spec.name} is {spec.protocol}, "
                                                            "without TLS")
            if op == OP_DELETE:
                values.pop(name, None)
            else:
                try:
                    BROKER_KEYS[key].parse(value)
                except ConfigError as exc:
                    raise KafkaError(ErrorCode.INVALID_REQUEST, f"Invalid dynamic configuration: {exc}") from None
                values[name] = str(value)
            if op == OP_DELETE and name not in self.values:
                continue  # nothing to delete: nothing changes (a key store file is reloaded only when named)
            touched.add(listener)
        plan = _Plan(values, {}, {}, {})
        overlay = self.overlay(values)
        for listener in sorted(touched):
            spec = self._specs[listener]
            settings = ListenerSettings(spec, overlay)
            try:
                context = server_context(settings, spec.name)
                plan.certificates[listener] = _leaf(settings)
                self._compatible(ListenerSettings(spec, self.overlay()), settings, self._certificates.get(listener),
                                 plan.certificates[listener])
            except TlsConfigError as exc:
                log.info("listener %s: refused a new SSL context: %s", spec.name, exc)
                raise KafkaError(ErrorCode.INVALID_REQUEST, f"Invalid dynamic configuration of listener "
                                                            f"{spec.name}: {exc}; its key store is unchanged"
                                 ) from None
            plan.contexts[spec.name.lower()] = context
            plan.settings[spec.name.lower()] = settings
        return plan

    def commit(self, plan: _Plan) -> None:
        """Keep the new values (durably, before anything changes) and put the new contexts in service."""
        if plan.values != self.values:
            os.makedirs(self.path.parent, exist_ok=True)
            data = json.dumps({"version": 1, "configs": plan.values}, indent=1, sort_keys=True).encode()
            atomic_write(self.path, data, mode=0o600)
            self.values = plan.values
        for listener, context in plan.contexts.items():
            runtime = self._listeners.get(listener)
            if runtime is None:
                continue
            front = runtime.ssl_context
            self._current[listener] = context
            self._certificates[listener] = plan.certificates[listener]
            if front.sni_callback is None:
                front.sni_callback = self._switch_to_current(listener)
            runtime.settings = plan.settings[listener]
            log.info("listener %s: new SSL context in service (key store from %s); connections already open keep "
                     "theirs", runtime.name, plan.settings[listener]["ssl.keystore.location"] or "PEM texts")

    def _switch_to_current(self, listener: str) -> Any:
        current = self._current

        def switch(ssl_object: ssl.SSLObject, server_name: str | None, context: ssl.SSLContext) -> None:
            wanted = current.get(listener)
            if wanted is not None and wanted is not context:
                ssl_object.context = wanted

        return switch

    # -- Kafka's checks of a replaced key store (SslFactory.CertificateEntries) --------------------------------
    @staticmethod
    def _compatible(old: ListenerSettings, new: ListenerSettings, before: Any, after: Any) -> None:
        if not (old["ssl.truststore.location"] or old["ssl.truststore.certificates"]) and (
                new["ssl.truststore.location"] or new["ssl.truststore.certificates"]):
            raise TlsConfigError("Cannot add SSL truststore to an existing listener for which no truststore was "
                                 "configured.")
        if before is None or after is None:
            return
        from cryptography import x509

        old_dn, new_dn = before.subject.rfc4514_string(), after.subject.rfc4514_string()
        if not new["ssl.allow.dn.changes"] and old_dn.lower() != new_dn.lower():
            raise TlsConfigError(f"Keystore DistinguishedName does not match: existing={old_dn}, new={new_dn} "
                                 "(ssl.allow.dn.changes is false)")
        if not new["ssl.allow.san.changes"]:
            def names(cert: Any) -> set[str]:
                try:
                    ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
                except x509.ExtensionNotFound:
                    return set()
                return {str(n.value) for n in ext}

            missing = names(before) - names(after)
            if missing:
                raise TlsConfigError(f"Keystore SubjectAltNames do not match: the new certificate lacks "
                                     f"{', '.join(sorted(missing))} (ssl.allow.san.changes is false)")


def _leaf(settings: ListenerSettings) -> Any:
    """The first certificate of a listener's PEM key store (its own), or None when it cannot be read."""
    from cryptography import x509

    text = settings["ssl.keystore.certificate.chain"]
    try:
        if not text:
            with open(settings["ssl.keystore.location"], "rb") as f:
                data = f.read()
        else:
            data = text.encode()
        return x509.load_pem_x509_certificates(data)[0]
    except (OSError, ValueError, IndexError, TypeError):
        return None
