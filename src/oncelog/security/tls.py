"""A listener's TLS: the server context from Kafka's PEM keys, and who a client certificate says the client is.

Kafka takes a PEM key store either as one file (`ssl.keystore.location`: the PKCS#8 key followed by the
certificate chain) or as two PEM texts (`ssl.keystore.key`, `ssl.keystore.certificate.chain`), an encrypted key
with `ssl.key.password`, and trusted CAs as a file or text. Everything is loaded at start, so a missing file or a
wrong password stops the broker with the key's name instead of failing each handshake later. A reload builds a
new context; connections already open keep theirs, as in Kafka.

The principal of a client that presents a certificate is `User:<distinguished name>` in RFC 2253 form (what
Java's `X500Principal.getName()` gives, which is what Kafka's rules are written against), mapped by
`ssl.principal.mapping.rules`.
"""

from __future__ import annotations

import os
import re
import ssl
import tempfile
from dataclasses import dataclass
from typing import Any

ANONYMOUS = "User:ANONYMOUS"
_TLS_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}


class TlsConfigError(ValueError):
    """A TLS setting that cannot be used; the message names the key."""


def server_context(settings: Any, name: str = "") -> ssl.SSLContext:
    """The SSLContext of one listener. `settings[key]` gives the listener's value of each `ssl.*` key."""
    where = f" (listener {name})" if name else ""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    enabled = [v for v in settings["ssl.enabled.protocols"] or [] if v in _TLS_VERSIONS]
    if not enabled:
        raise TlsConfigError(f"ssl.enabled.protocols{where}: no TLS version left to offer")
    # ssl.protocol is the highest version the context speaks (Kafka: SSLContext.getInstance(ssl.protocol)), and
    # ssl.enabled.protocols the versions offered under it
    ceiling = _TLS_VERSIONS.get(settings["ssl.protocol"] or "TLSv1.3", ssl.TLSVersion.TLSv1_3)
    offered = [_TLS_VERSIONS[v] for v in enabled if _TLS_VERSIONS[v] <= ceiling]
    if not offered:
        raise TlsConfigError(f"ssl.enabled.protocols{where} {enabled}: none at or below ssl.protocol "
                             f"{settings['ssl.protocol']}")
    context.minimum_version = min(offered)
    context.maximum_version = max(offered)
    suites = settings["ssl.cipher.suites"] or []
    if suites:
        try:
            context.set_ciphers(":".join(suites))
        except ssl.SSLError as exc:
            raise TlsConfigError(f"ssl.cipher.suites{where}: none of {suites} is known: {exc}") from None
    _load_keystore(context, settings, where)
    client_auth = (settings["ssl.client.auth"] or "none").lower()
    trusted = _load_truststore(context, settings, where)
    if client_auth != "none" and not trusted:
        raise TlsConfigError(f"ssl.client.auth={client_auth}{where} needs ssl.truststore.location or "
                             "ssl.truststore.certificates to verify client certificates")
    context.verify_mode = {"required": ssl.CERT_REQUIRED, "requested": ssl.CERT_OPTIONAL}.get(client_auth,
                                                                                              ssl.CERT_NONE)
    return context


def _load_keystore(context: ssl.SSLContext, settings: Any, where: str) -> None:
    location = settings["ssl.keystore.location"]
    chain, key = settings["ssl.keystore.certificate.chain"], settings["ssl.keystore.key"]
    password = settings["ssl.key.password"] or None
    if (chain or key) and location:
        raise TlsConfigError(f"ssl.keystore.location and ssl.keystore.key / ssl.keystore.certificate.chain{where} "
                             "are alternatives: set one")
    if chain or key:
        if not (chain and key):
            raise TlsConfigError(f"ssl.keystore.certificate.chain and ssl.keystore.key{where} go together")
        _load_pem_texts(context, chain, key, password, where)
        return
    if not location:
        raise TlsConfigError(f"an SSL listener{where} needs a key store: ssl.keystore.location (PEM: key and "
                             "certificate chain), or ssl.keystore.key with ssl.keystore.certificate.chain")
    if not os.path.isfile(location):
        raise TlsConfigError(f"ssl.keystore.location{where}: no such file: {location}")
    try:
        context.load_cert_chain(location, password=password)
    except ssl.SSLError as exc:
        hint = ", or a wrong ssl.key.password" if password else " (an encrypted key needs ssl.key.password)"
        raise TlsConfigError(f"ssl.keystore.location{where}: cannot load the key and certificate chain from "
                             f"{location}{hint}: {exc.reason or exc}") from None


def _load_pem_texts(context: ssl.SSLContext, chain: str, key: str, password: str | None, where: str) -> None:
    """`load_cert_chain` reads files only: the texts go through a private temporary file, removed at once."""
    fd, path = tempfile.mkstemp(prefix="oncelog-keystore-", suffix=".pem")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(key.strip() + "\n" + chain.strip() + "\n")
        context.load_cert_chain(path, password=password)
    except ssl.SSLError as exc:
        raise TlsConfigError(f"ssl.keystore.key / ssl.keystore.certificate.chain{where}: cannot load: "
                             f"{exc.reason or exc}") from None
    finally:
        os.unlink(path)


def _load_truststore(context: ssl.SSLContext, settings: Any, where: str) -> bool:
    location, certificates = settings["ssl.truststore.location"], settings["ssl.truststore.certificates"]
    try:
        if location:
            if not os.path.isfile(location):
                raise TlsConfigError(f"ssl.truststore.location{where}: no such file: {location}")
            context.load_verify_locations(cafile=location)
        if certificates:
            context.load_verify_locations(cadata=certificates)
    except ssl.SSLError as exc:
        raise TlsConfigError(f"ssl.truststore{where}: cannot load CA certificates: {exc.reason or exc}") from None
    return bool(location or certificates)


# -- principals ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Rule:
    pattern: re.Pattern[str] | None  # None: DEFAULT
    replacement: str = ""
    case: str = ""  # "L", "U" or ""

    def apply(self, dn: str) -> str | None:
        if self.pattern is None:
            return dn
        match = self.pattern.fullmatch(dn)
        if match is None:
            return None
        out = match.expand(self.replacement)
        return out.lower() if self.case == "L" else out.upper() if self.case == "U" else out


_RULE = re.compile(r"\s*(?:(DEFAULT)|RULE:((?:\\.|[^\\/])*)/((?:\\.|[^\\/])*)/([LU]?))\s*(?:,|\n|$)")


_DIGITS = tuple("0123456789")


def _template(replacement: str, groups: int, rules: str) -> str:
    """A rule's replacement as a `Match.expand` template, checked now rather than when a certificate matches.

    Java's replacement syntax, as Kafka applies it: `$n` is group n (further digits join while they name a group
    the regex has), `\\$` and `\\\\` are a literal `$` and backslash, any other backslash is literal. A `$` that
    names no group of the regex is refused here: applied to a client's certificate it would fail every handshake
    whose name the rule matches."""
    out, i = [], 0
    while i < len(replacement):
        char = replacement[i]
        if char == "\\" and replacement[i + 1:i + 2] in ("$", "\\"):
            out.append("\\\\" if replacement[i + 1] == "\\" else "$")
            i += 2
        elif char == "\\":
            out.append("\\\\")
            i += 1
        elif char == "$":
            if replacement[i + 1:i + 2] not in _DIGITS or int(replacement[i + 1]) > groups:
                raise TlsConfigError(f"Invalid value {rules!r} for configuration ssl.principal.mapping.rules: "
                                     f"{replacement[i:i + 2]!r} in {replacement!r} names no group of the rule's "
                                     "regex (write \\$ for a literal $)")
            end = i + 2
            while replacement[end:end + 1] in _DIGITS and end < len(replacement) \
                    and int(replacement[i + 1:end + 1]) <= groups:
                end += 1
            out.append(f"\\g<{replacement[i + 1:end]}>")
            i = end
        else:
            out.append(char)
            i += 1
    return "".join(out)


class PrincipalMapper:
    """`ssl.principal.mapping.rules`: DEFAULT, or `RULE:<regex>/<replacement>/[L|U]` items separated by commas,
    tried in order; the first whose regex matches the whole DN gives the name (`$1` refers to a group). A DN no
    rule matches fails the handshake's authentication, as in Kafka."""

    def __init__(self, rules: str) -> None:
        self.rules: list[_Rule] = []
        text = (rules or "DEFAULT").strip()
        pos = 0
        while pos < len(text):
            match = _RULE.match(text, pos)
            if match is None or match.end() == pos:
                raise TlsConfigError(f"Invalid value {rules!r} for configuration ssl.principal.mapping.rules: "
                                     f"cannot parse at {text[pos:pos + 30]!r}")
            pos = match.end()
            if match.group(1):
                self.rules.append(_Rule(None))
                continue
            try:
                pattern = re.compile(match.group(2).replace("\\/", "/"))
            except re.error as exc:
                raise TlsConfigError(f"ssl.principal.mapping.rules: bad regex {match.group(2)!r}: {exc}") from None
            replacement = _template(match.group(3).replace("\\/", "/"), pattern.groups, rules)
            self.rules.append(_Rule(pattern, replacement, match.group(4)))

    def name(self, dn: str) -> str | None:
        for rule in self.rules:
            out = rule.apply(dn)
            if out is not None:
                return out
        return None


def certificate_dn(der: bytes) -> str:
    """The subject of a DER certificate in RFC 2253 form (most specific attribute first, as Java prints it)."""
    from cryptography import x509

    return x509.load_der_x509_certificate(der).subject.rfc4514_string()


def tls_principal(ssl_object: ssl.SSLObject | None, mapper: PrincipalMapper) -> str | None:
    """`User:<mapped DN>` of the client certificate, ANONYMOUS without one; None when no rule maps the DN
    (the connection is then closed)."""
    der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
    if not der:
        return ANONYMOUS
    name = mapper.name(certificate_dn(der))
    return None if name is None else f"User:{name}"
