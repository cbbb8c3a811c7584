"""SASL on a Kafka connection (KIP-152): SaslHandshake names the mechanism, SaslAuthenticate carries its tokens.

The exchange runs right after ApiVersions on a new connection and again, on the same connection, before the
session the broker granted runs out (KIP-368: `connections.max.reauth.ms` on the broker; the broker closes a
connection whose session expired). The mechanisms are small state machines over bytes:

- PLAIN (RFC 4616): one message, `\\0user\\0password`;
- SCRAM-SHA-256/512 (RFC 5802/7677): client-first, server-first, client-final, server-final, computed by
  `scramp`; the server's final signature is checked, so a broker that does not know the password cannot
  pretend it does;
- OAUTHBEARER (RFC 7628): the GS2 header and `auth=Bearer <token>`, with optional extensions; a rejected
  token gets the broker's JSON error as a challenge, which the client acknowledges with a single 0x01 before
  the broker reports the failure.

Every refusal is an `AuthenticationError` that names the cause: it is not retriable.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from oncelog.protocol import client_codecs as codecs
from oncelog.protocol.primitives import ProtocolError

from .errors import AuthenticationError, NetworkError
from .security import SaslCredentials

__all__ = ["authenticate", "reauthentication_delay", "SASL_HANDSHAKE", "SASL_AUTHENTICATE"]

SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36
_HANDSHAKE_VERSION = 1  # v0 sent raw tokens outside Kafka framing; Kafka 4.0 removed it (KIP-896)
_AUTHENTICATE_MAX = 2

#: (api_key, version, body) -> response body: the connection's own request path
Send = Callable[[int, int, bytes], Awaitable[Any]]


class _Plain:
    def __init__(self, creds: SaslCredentials) -> None:
        self.creds = creds

    def first(self) -> bytes:
        return b"\0" + self.creds.username.encode() + b"\0" + self.creds.password.encode()

    def next(self, challenge: bytes) -> bytes | None:
        return None


class _Scram:
    def __init__(self, creds: SaslCredentials) -> None:
        import scramp

        self._errors = (scramp.ScramException,)
        self.client = scramp.ScramClient([creds.mechanism], creds.username, creds.password)
        self.step = 0

    def first(self) -> bytes:
        return self.client.get_client_first().encode()

    def next(self, challenge: bytes) -> bytes | None:
        self.step += 1
        try:
            if self.step == 1:
                self.client.set_server_first(challenge.decode())
                return self.client.get_client_final().encode()
            self.client.set_server_final(challenge.decode())
        except self._errors as exc:
            raise AuthenticationError(f"SCRAM exchange failed: {exc}") from None
        return None


class _OAuthBearer:
    def __init__(self, creds: SaslCredentials) -> None:
        self.creds = creds
        self.rejected = False

    def _token(self) -> tuple[str, dict[str, str]]:
        creds = self.creds
        extensions = dict(creds.extensions)
        if creds.token_provider is None:
            return creds.token or "", extensions
        try:
            answer = creds.token_provider(creds.oauthbearer_config)
        except Exception as exc:
            raise AuthenticationError(f"oauth_cb raised {exc!r}") from None
        if isinstance(answer, str):
            return answer, extensions
        token = answer[0]
        if len(answer) > 3 and answer[3]:
            extensions.update(answer[3])
        return token, extensions

    def first(self) -> bytes:
        token, extensions = self._token()
        if not token:
            raise AuthenticationError("the OAUTHBEARER token is empty")
        parts = ["n,,", f"auth=Bearer {token}"] + [f"{k}={v}" for k, v in extensions.items()]
        return ("\x01".join(parts) + "\x01\x01").encode()

    def next(self, challenge: bytes) -> bytes | None:
        if challenge and not self.rejected:
            # The broker's error details (JSON): acknowledge them; its next answer is the failure.
            self.rejected = True
            self.error_details = challenge.decode(errors="replace")
            return b"\x01"
        return None


_MECHANISMS = {"PLAIN": _Plain, "SCRAM-SHA-256": _Scram, "SCRAM-SHA-512": _Scram, "OAUTHBEARER": _OAuthBearer}


async def authenticate(creds: SaslCredentials, api_versions: dict[int, tuple[int, int]], address: str,
                       send: Send) -> int:
    """Run one SASL exchange; the session lifetime the broker granted in ms (0: no limit).

    `send(api_key, version, body)` is the connection's request path; it returns the response body.
    """
    if SASL_HANDSHAKE not in api_versions or SASL_AUTHENTICATE not in api_versions:
        raise AuthenticationError(
            f"broker {address} does not offer SASL (no SaslHandshake/SaslAuthenticate in ApiVersions): "
            "its listener is not a SASL listener; check security.protocol and the port")
    low, high = api_versions[SASL_HANDSHAKE]
    if not low <= _HANDSHAKE_VERSION <= high:
        raise AuthenticationError(f"broker {address} speaks SaslHandshake v{low}..v{high} only; "
                                  f"this client needs v{_HANDSHAKE_VERSION}")
    body = codecs.encode_request(SASL_HANDSHAKE, _HANDSHAKE_VERSION, {"mechanism": creds.mechanism})
    frame = await send(SASL_HANDSHAKE, _HANDSHAKE_VERSION, body)
    response = _decode(SASL_HANDSHAKE, _HANDSHAKE_VERSION, frame, address)
    if response.error_code == 33:
        enabled = ", ".join(response.mechanisms) or "none"
        raise AuthenticationError(
            f"sasl.mechanism {creds.mechanism} is not enabled on broker {address} (it enables: {enabled})", 33)
    if response.error_code == 34:
        raise AuthenticationError(
            f"broker {address} did not expect a SASL handshake on this connection (ILLEGAL_SASL_STATE): "
            "is the listener a SASL listener?", 34)
    if response.error_code:
        raise AuthenticationError(f"SaslHandshake with {address} failed", response.error_code)

    version = min(_AUTHENTICATE_MAX, api_versions[SASL_AUTHENTICATE][1])
    mechanism = _MECHANISMS[creds.mechanism](creds)
    token: bytes | None = mechanism.first()
    lifetime = 0
    while token is not None:
        body = codecs.encode_request(SASL_AUTHENTICATE, version, {"auth_bytes": token})
        frame = await send(SASL_AUTHENTICATE, version, body)
        response = _decode(SASL_AUTHENTICATE, version, frame, address)
        if response.error_code:
            detail = response.error_message or ""
            extra = getattr(mechanism, "error_details", None)
            if extra:
                detail = f"{detail} ({extra})" if detail else extra
            raise AuthenticationError(
                f"SASL {creds.mechanism} authentication with {address} failed"
                + (f": {detail}" if detail else "") + _who(creds), response.error_code)
        lifetime = getattr(response, "session_lifetime_ms", 0) or 0
        token = mechanism.next(bytes(response.auth_bytes or b""))
    return lifetime


def _decode(api_key: int, version: int, frame: Any, address: str) -> Any:
    """A garbled SASL answer is a broken stream (the connection is closed), not a crash of the caller."""
    try:
        return codecs.decode_response(api_key, version, frame)
    except ProtocolError as exc:
        raise NetworkError(f"undecodable SASL response from {address}: {exc}") from None


def _who(creds: SaslCredentials) -> str:
    return f" (sasl.username {creds.username!r})" if creds.username else ""


def reauthentication_delay(lifetime_ms: int, jitter: float) -> float:
    """Seconds until re-authenticating: 85-95% of the session (`jitter` in [0, 1)), as Kafka's clients do,
    so that many connections made at once do not all re-authenticate at once."""
    return lifetime_ms / 1000 * (0.85 + 0.10 * jitter)
