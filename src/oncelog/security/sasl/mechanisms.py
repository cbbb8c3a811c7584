"""The server side of each SASL mechanism: bytes in, bytes out, and a principal once the exchange succeeds.

Each mechanism is a factory of `SaslExchange`s, one per authentication (a re-authentication starts a new one).
The cryptography is the libraries': SCRAM is `scramp`'s server, passwords are compared with
`hmac.compare_digest`. A failed exchange raises `AuthenticationFailed` with the message Kafka's broker sends,
which is all the client learns (never whether the user exists).
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping
from typing import Protocol

from ..credentials import MAX_ITERATIONS, CredentialStore


class AuthenticationFailed(Exception):
    """The client's credentials were refused; str() is what the client is told."""


class SaslExchange(Protocol):
    complete: bool
    principal: str | None
    # When the credential itself expires (OAUTHBEARER's token), in ms since the epoch; None: it does not.
    credential_expires_ms: int | None

    def step(self, token: bytes) -> bytes: ...


ExchangeFactory = Callable[[], SaslExchange]


class PlainExchange:
    """RFC 4616: one message `authzid NUL authcid NUL password`, checked against the listener's JAAS users."""

    def __init__(self, users: Mapping[str, str]) -> None:
        self._users = users
        self.complete = False
        self.principal: str | None = None
        self.credential_expires_ms: int | None = None

    def step(self, token: bytes) -> bytes:
        parts = token.split(b"\x00")
        if len(parts) != 3:
            raise AuthenticationFailed("Invalid SASL/PLAIN response: expected 3 tokens")
        try:
            authzid, user, password = (p.decode("utf-8") for p in parts)
        except UnicodeDecodeError:
            raise AuthenticationFailed("Invalid SASL/PLAIN response: not UTF-8") from None
        if not user:
            raise AuthenticationFailed("Authentication failed: username not specified")
        if not password:
            raise AuthenticationFailed("Authentication failed: password not specified")
        expected = self._users.get(user)
        # compare even for an unknown user, so the time taken does not say whether the user exists
        ok = hmac.compare_digest((expected or "\x00" + password).encode(), password.encode())
        if expected is None or not ok:
            raise AuthenticationFailed("Authentication failed: Invalid username or password")
        if authzid and authzid != user:
            raise AuthenticationFailed("Authentication failed: Client requested an authorization id that is "
                                       "different from username")
        self.complete, self.principal = True, f"User:{user}"
        return b""


class ScramExchange:
    """RFC 5802 through scramp's server: client-first, server-first, client-final, server-final."""

    def __init__(self, mechanism: str, credentials: CredentialStore) -> None:
        from scramp import ScramMechanism

        self._mechanism = mechanism
        self._credentials = credentials
        self._server = ScramMechanism(mechanism).make_server(self._auth_info)
        self._user: str | None = None
        self._first = True
        self.complete = False
        self.principal: str | None = None
        self.credential_expires_ms: int | None = None

    def _failed(self) -> AuthenticationFailed:
        return AuthenticationFailed("Authentication failed during authentication due to invalid credentials "
                                    f"with SASL mechanism {self._mechanism}")

    def _auth_info(self, username: str) -> tuple[bytes, bytes, bytes, int]:
        # RFC 5802 saslname: ',' and '=' arrive escaped as =2C and =3D
        user = username.replace("=2C", ",").replace("=3D", "=")
        credential = self._credentials.get(user, self._mechanism)
        if credential is None or credential.iterations > MAX_ITERATIONS:
            raise self._failed()
        self._user = user
        return credential.salt, credential.stored_key, credential.server_key, credential.iterations

    def step(self, token: bytes) -> bytes:
        from scramp import ScramException

        try:
            text = token.decode("utf-8")
            if self._first:
                self._first = False
                self._server.set_client_first(text)
                return self._server.get_server_first().encode()
            self._server.set_client_final(text)
            final = self._server.get_server_final().encode()
        except AuthenticationFailed:
            raise
        except (ScramException, UnicodeDecodeError, ValueError, IndexError, KeyError):
            raise self._failed() from None
        self.complete, self.principal = True, f"User:{self._user}"
        return final
