"""How a client reaches a secured cluster: the TLS context and the SASL credentials, from Kafka's config keys.

Everything here is decided once per client, when it is built: a CA file that does not exist, a key whose
password is wrong or a mechanism nobody supports is a `ValueError` naming the key at construction, not a
connection that fails later and is retried forever. The keys are the librdkafka/Java client names users
bring along (`security.protocol`, `ssl.ca.location`, `sasl.mechanism`, ...), and the Java client's PEM
spellings (`ssl.truststore.type=PEM`, `sasl.jaas.config`) for Spark pipelines that move between
`format("kafka")` and `format("oncelog")` with the same options.

TLS is the standard library's `ssl`; SCRAM is `scramp`: no cryptography is written here.
"""

from __future__ import annotations

import os
import re
import ssl
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Security", "SaslCredentials", "security_from_config", "PROTOCOLS", "MECHANISMS"]

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")

#: A token provider: called with `sasl.oauthbearer.config`, returns (token, expiry as seconds since the epoch)
#: like confluent-kafka's `oauth_cb`; a third and fourth item (principal, extensions dict) are accepted too.
TokenProvider = Callable[[str | None], Any]


@dataclass(frozen=True)
class SaslCredentials:
    mechanism: str
    username: str | None = None
    password: str | None = None
    #: OAUTHBEARER: a fixed token, or a provider asked for a fresh one at every (re-)authentication
    token: str | None = None
    token_provider: TokenProvider | None = None
    oauthbearer_config: str | None = None
    extensions: tuple[tuple[str, str], ...] = ()

    def __repr__(self) -> str:  # never print a secret
        return f"SaslCredentials(mechanism={self.mechanism!r}, username={self.username!r})"


@dataclass(frozen=True)
class Security:
    protocol: str
    ssl_context: ssl.SSLContext | None = None
    sasl: SaslCredentials | None = None

    @property
    def tls(self) -> bool:
        return self.ssl_context is not None


_PLAINTEXT = Security("PLAINTEXT")


def security_from_config(config: Any) -> Security:
    """The `Security` a ClientConfig asks for; `ValueError` naming the key for anything unusable."""
    protocol = config["security.protocol"]
    if protocol == "PLAINTEXT":
        _refuse_unused(config, protocol)
        return _PLAINTEXT
    context = _ssl_context(config) if protocol in ("SSL", "SASL_SSL") else None
    sasl = _sasl_credentials(config) if protocol.startswith("SASL_") else None
    return Security(protocol, context, sasl)


def _refuse_unused(config: Any, protocol: str) -> None:
    """SASL settings with a protocol that never uses them are a mistake worth saying, not ignoring."""
    for key in ("sasl.mechanism", "sasl.username", "sasl.password", "sasl.jaas.config"):
        if key in config:
            raise ValueError(f"{key} is set but security.protocol is {protocol}: "
                             "use SASL_SSL or SASL_PLAINTEXT for SASL authentication")


# -- TLS ----------------------------------------------------------------------------------------


def _ssl_context(config: Any) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    verify = config["enable.ssl.certificate.verification"]
    algorithm = (config["ssl.endpoint.identification.algorithm"] or "none").strip().lower()
    if algorithm not in ("https", "none"):
        raise ValueError(f"ssl.endpoint.identification.algorithm: expected https or none, got {algorithm!r}")
    context.check_hostname = verify and algorithm == "https"
    context.verify_mode = ssl.CERT_REQUIRED if verify else ssl.CERT_NONE
    _load_trust(context, config)
    _load_client_certificate(context, config)
    return context


def _load_trust(context: ssl.SSLContext, config: Any) -> None:
    ca = config["ssl.ca.location"]
    truststore_type = (config["ssl.truststore.type"] or "PEM").upper()
    java_location = config["ssl.truststore.location"]
    java_pem = config["ssl.truststore.certificates"]
    if (java_location or java_pem) and truststore_type != "PEM":
        raise ValueError(
            f"ssl.truststore.type {truststore_type}: the oncelog client reads PEM trust stores only; export the "
            "CA certificate as PEM (keytool -exportcert -rfc ...) and give it as ssl.ca.location")
    if ca and ca.lower() == "probe":  # librdkafka: look for the system's CA bundle
        ca = None
    try:
        if ca:
            if os.path.isdir(ca):
                context.load_verify_locations(capath=ca)
            else:
                _readable(ca, "ssl.ca.location")
                context.load_verify_locations(cafile=ca)
        if java_location:
            _readable(java_location, "ssl.truststore.location")
            context.load_verify_locations(cafile=java_location)
        if java_pem:
            context.load_verify_locations(cadata=java_pem)
    except ssl.SSLError as exc:
        raise ValueError(f"ssl.ca.location: cannot load CA certificates: {exc}") from None
    if not (ca or java_location or java_pem):
        context.load_default_certs()


def _load_client_certificate(context: ssl.SSLContext, config: Any) -> None:
    """Mutual TLS: librdkafka's ssl.certificate.location + ssl.key.location, or Java's PEM keystore."""
    cert, key = config["ssl.certificate.location"], config["ssl.key.location"]
    password = config["ssl.key.password"]
    keystore_type = (config["ssl.keystore.type"] or "PEM").upper()
    keystore = config["ssl.keystore.location"]
    chain_pem, key_pem = config["ssl.keystore.certificate.chain"], config["ssl.keystore.key"]
    if (keystore or chain_pem or key_pem) and keystore_type != "PEM":
        raise ValueError(
            f"ssl.keystore.type {keystore_type}: the oncelog client reads PEM key stores only; give the "
            "certificate and key as PEM files in ssl.certificate.location and ssl.key.location")
    if key and not cert:
        raise ValueError("ssl.key.location is set without ssl.certificate.location")
    if chain_pem or key_pem:
        if not (chain_pem and key_pem):
            raise ValueError("ssl.keystore.certificate.chain and ssl.keystore.key go together")
        _load_pem_strings(context, chain_pem, key_pem, password)
        return
    if keystore and not cert:
        cert = keystore  # a PEM keystore file holds the key and the certificate chain
    if not cert:
        return
    _readable(cert, "ssl.certificate.location")
    if key:
        _readable(key, "ssl.key.location")
    try:
        context.load_cert_chain(cert, key, password=password)
    except ssl.SSLError as exc:
        hint = " (wrong ssl.key.password?)" if password or "PASSWORD" in str(exc).upper() else ""
        raise ValueError(f"ssl.certificate.location / ssl.key.location: cannot load the client certificate "
                         f"and key{hint}: {exc}") from None


def _load_pem_strings(context: ssl.SSLContext, chain: str, key: str, password: str | None) -> None:
    """`load_cert_chain` takes files only: write the PEM strings to a private temporary file and load it."""
    fd, path = tempfile.mkstemp(prefix="oncelog-keystore-", suffix=".pem")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(key.strip() + "\n" + chain.strip() + "\n")
        context.load_cert_chain(path, password=password)
    except ssl.SSLError as exc:
        raise ValueError(f"ssl.keystore.key / ssl.keystore.certificate.chain: cannot load: {exc}") from None
    finally:
        os.unlink(path)


def _readable(path: str, key: str) -> None:
    if not os.path.isfile(path):
        raise ValueError(f"{key}: no such file: {path}")
    if not os.access(path, os.R_OK):
        raise ValueError(f"{key}: cannot read {path}")


# -- SASL ---------------------------------------------------------------------------------------

_JAAS_OPTION = re.compile(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"')
_JAAS_MODULES = {
    "org.apache.kafka.common.security.plain.PlainLoginModule": ("PLAIN",),
    "org.apache.kafka.common.security.scram.ScramLoginModule": ("SCRAM-SHA-256", "SCRAM-SHA-512"),
    "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule": ("OAUTHBEARER",),
}


def _sasl_credentials(config: Any) -> SaslCredentials:
    mechanism = (config["sasl.mechanism"] or "GSSAPI").upper()
    if mechanism not in MECHANISMS:
        raise ValueError(f"sasl.mechanism {mechanism} is not supported by the oncelog client "
                         f"(it speaks {', '.join(MECHANISMS)})")
    username, password = config["sasl.username"], config["sasl.password"]
    jaas = config["sasl.jaas.config"]
    if jaas:
        module = jaas.strip().split(None, 1)[0]
        if module not in _JAAS_MODULES:
            raise ValueError(f"sasl.jaas.config: login module {module} is not one the oncelog client knows "
                             f"({', '.join(_JAAS_MODULES)})")
        if mechanism not in _JAAS_MODULES[module]:
            raise ValueError(f"sasl.jaas.config: {module} does not do sasl.mechanism {mechanism}")
        options = {k: bytes(v, "utf-8").decode("unicode_escape") for k, v in _JAAS_OPTION.findall(jaas)}
        username = username or options.get("username")
        password = password or options.get("password")
    if mechanism == "OAUTHBEARER":
        return _oauthbearer(config)
    if not username or password is None:
        raise ValueError(f"sasl.mechanism {mechanism} needs sasl.username and sasl.password "
                         "(or sasl.jaas.config with username and password)")
    return SaslCredentials(mechanism, username=username, password=password)


def _oauthbearer(config: Any) -> SaslCredentials:
    token, provider = config["sasl.oauthbearer.token"], config["oauth_cb"]
    if token and provider:
        raise ValueError("give either sasl.oauthbearer.token or oauth_cb, not both")
    if not token and provider is None:
        raise ValueError("sasl.mechanism OAUTHBEARER needs a token: sasl.oauthbearer.token (a fixed token) or "
                         "oauth_cb (a function returning (token, expiry_seconds))")
    if provider is not None and not callable(provider):
        raise ValueError("oauth_cb: expected a callable")
    extensions: list[tuple[str, str]] = []
    for item in (config["sasl.oauthbearer.extensions"] or "").split(","):
        if not item.strip():
            continue
        key, sep, value = item.strip().partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z]+", key) or key == "auth":
            raise ValueError(f"sasl.oauthbearer.extensions: expected key=value pairs, got {item!r}")
        extensions.append((key, value))
    return SaslCredentials("OAUTHBEARER", token=token, token_provider=provider,
                           oauthbearer_config=config["sasl.oauthbearer.config"], extensions=tuple(extensions))
