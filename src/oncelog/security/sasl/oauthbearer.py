"""OAUTHBEARER on the broker (KIP-255, RFC 7628), validating JWTs as Kafka's OAuthBearerValidatorCallbackHandler
does (KIP-768): the signature against a JWKS, `exp` (required) and `iat`/`nbf` within the clock skew, the
expected audience and issuer when configured, the subject from `sasl.oauthbearer.sub.claim.name`.

PyJWT checks signatures and claims; nothing cryptographic is written here. The key set is read when the broker
starts and refreshed off the event loop (`JwksKeys.refresh`, every `sasl.oauthbearer.jwks.endpoint.refresh.ms`
and when a token names a key id not yet known), so an exchange never waits on the network. Unlike Kafka,
oncelog has no "unsecured" validator that takes unsigned tokens: a listener offering OAUTHBEARER needs a JWKS.

RFC 7628's failure: the server answers a JSON error, the client acknowledges with one %x01 byte, then the
authentication fails with the message, which is what librdkafka and the Java client expect.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from .mechanisms import AuthenticationFailed

log = logging.getLogger("oncelog.security")

_ALGORITHMS = ["RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "PS256", "PS384", "PS512"]


class JwksError(ValueError):
    """The key set cannot be read; the message names the key."""


def _read_jwks(location: str, timeout: float = 10.0) -> dict[str, Any]:
    parsed = urllib.parse.urlparse(location)
    try:
        if parsed.scheme in ("http", "https"):
            with urllib.request.urlopen(location, timeout=timeout) as answer:  # noqa: S310 - the operator's URL
                text = answer.read().decode()
        else:
            path = urllib.parse.unquote(parsed.path) if parsed.scheme == "file" else location
            with open(path, encoding="utf-8") as f:
                text = f.read()
        data = json.loads(text)
    except (OSError, ValueError) as exc:
        raise JwksError(f"sasl.oauthbearer.jwks.endpoint.url {location}: cannot read a JWKS: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("keys"), list):
        raise JwksError(f"sasl.oauthbearer.jwks.endpoint.url {location}: not a JWKS (no \"keys\" list)")
    return data


class JwksKeys:
    """The current signing keys by key id, swapped whole on refresh (a reader never sees half a set)."""

    def __init__(self, location: str, refresh_ms: int) -> None:
        import jwt

        self.location = location
        self.refresh_ms = refresh_ms
        self._jwt = jwt
        self._keys: dict[str | None, Any] = {}
        self._lock = threading.Lock()
        self._last_refresh = 0.0
        self.refresh()

    def refresh(self) -> None:
        """Read the JWKS again (blocking: run it in a thread once the broker serves)."""
        keys: dict[str | None, Any] = {}
        for jwk in _read_jwks(self.location)["keys"]:
            try:
                key = self._jwt.PyJWK(jwk)
            except Exception as exc:  # an unusable key (unknown kty, missing field): skipped, as Kafka does
                log.warning("JWKS %s: skipping key %s: %s", self.location, jwk.get("kid"), exc)
                continue
            if jwk.get("use", "sig") == "sig":
                keys[jwk.get("kid")] = key
        with self._lock:
            self._keys = keys
            self._last_refresh = time.monotonic()

    def get(self, kid: str | None) -> Any:
        return self._keys.get(kid) or (self._keys.get(None) if kid is None else None)

    def stale(self) -> bool:
        return (time.monotonic() - self._last_refresh) * 1000 >= self.refresh_ms


@dataclass(frozen=True)
class OAuthSettings:
    keys: JwksKeys
    audience: tuple[str, ...] = ()
    issuer: str | None = None
    clock_skew_s: int = 30
    sub_claim: str = "sub"
    scope_claim: str = "scope"


class OAuthBearerExchange:
    """One authentication: the client's initial response carries `auth=Bearer <jwt>` and its extensions."""

    def __init__(self, settings: OAuthSettings) -> None:
        self._settings = settings
        self._error: str | None = None
        self.complete = False
        self.principal: str | None = None
        self.credential_expires_ms: int | None = None

    def step(self, token: bytes) -> bytes:
        if self._error is not None:
            # RFC 7628 §3.2.3: the client acknowledged the error challenge; now the authentication fails
            raise AuthenticationFailed(f"Authentication failed: {self._error}")
        try:
            bearer = _bearer(token)
            self._validate(bearer)
        except _Invalid as exc:
            self._error = str(exc)
            return json.dumps({"status": "invalid_token"}).encode()
        self.complete = True
        return b""

    def _validate(self, bearer: str) -> None:
        import jwt

        s = self._settings
        try:
            header = jwt.get_unverified_header(bearer)
        except jwt.InvalidTokenError as exc:
            raise _Invalid(f"malformed JWT: {exc}") from None
        key = s.keys.get(header.get("kid"))
        if key is None:
            raise _Invalid(f"no key in the JWKS for key id {header.get('kid')!r}")
        options = {"require": ["exp"], "verify_aud": bool(s.audience)}
        try:
            claims = jwt.decode(bearer, key, algorithms=[header.get("alg", "")] if header.get("alg") in _ALGORITHMS
                                else _ALGORITHMS, audience=list(s.audience) or None, issuer=s.issuer,
                                leeway=s.clock_skew_s, options=options)  # type: ignore[arg-type]
        except jwt.ExpiredSignatureError:
            raise _Invalid("the token has expired") from None
        except jwt.InvalidTokenError as exc:
            raise _Invalid(f"the token is not valid: {exc}") from None
        subject = claims.get(s.sub_claim)
        if not isinstance(subject, str) or not subject:
            raise _Invalid(f"the token has no {s.sub_claim} claim")
        scope = claims.get(s.scope_claim)
        if scope is not None and not (isinstance(scope, str) or
                                      (isinstance(scope, list) and all(isinstance(x, str) for x in scope))):
            # as Kafka's validator: the scope claim, when present, is a string or a list of strings
            raise _Invalid(f"the {s.scope_claim} claim is neither a string nor a list of strings")
        self.principal = f"User:{subject}"
        self.credential_expires_ms = int(claims["exp"]) * 1000


class _Invalid(Exception):
    pass


def _bearer(message: bytes) -> str:
    """The token of an RFC 7628 initial client response: gs2-header, then %x01-separated key=value pairs."""
    try:
        text = message.decode("utf-8")
    except UnicodeDecodeError:
        raise _Invalid("the client's message is not UTF-8") from None
    header, sep, rest = text.partition("\x01")
    if not sep or not header.startswith(("n,", "y,")):
        raise _Invalid("the client's message has no GS2 header")
    fields = dict(item.partition("=")[::2] for item in rest.split("\x01") if item)
    auth = fields.get("auth", "")
    scheme, _, value = auth.partition(" ")
    if scheme.lower() != "bearer" or not value:
        raise _Invalid("no auth=Bearer <token> in the client's message")
    return value.strip()
