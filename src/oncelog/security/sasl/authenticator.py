"""One connection's SASL state machine (KIP-43 handshake, KIP-152 SaslAuthenticate, KIP-368 re-authentication).

States and what each allows, after Kafka's `SaslServerAuthenticator`:

    HANDSHAKE     ApiVersions, SaslHandshake
    AUTHENTICATE  SaslAuthenticate (the exchange of the mechanism the handshake chose)
    DONE          everything; a SaslHandshake starts a re-authentication (KIP-368)
    FAILED        nothing: the answer is sent, then the connection is closed

Any other request before DONE ends the connection without an answer (Kafka's IllegalSaslStateException). The
state machine knows nothing of sockets or the protocol's encoding: the SASL handlers feed it decoded fields and
encode what it returns.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from enum import Enum

from ...errors import ErrorCode
from .mechanisms import AuthenticationFailed, ExchangeFactory, SaslExchange

API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36


class State(Enum):
    HANDSHAKE = "handshake"
    AUTHENTICATE = "authenticate"
    DONE = "done"
    FAILED = "failed"


class Authenticator:
    def __init__(self, mechanisms: Mapping[str, ExchangeFactory], max_receive: int, max_reauth_ms: int) -> None:
        self.mechanisms = mechanisms
        self.max_receive = max_receive
        self.max_reauth_ms = max_reauth_ms
        self.state = State.HANDSHAKE
        self.principal: str | None = None
        self.mechanism: str | None = None
        self._exchange: SaslExchange | None = None
        # monotonic time after which the session must have re-authenticated (None: never)
        self.session_expires: float | None = None
        self.reauthenticating = False

    @property
    def authenticated(self) -> bool:
        return self.state is State.DONE or self.reauthenticating

    def allows(self, api_key: int) -> bool:
        """May a request with this key be dispatched now? False ends the connection. ApiVersions and the SASL
        requests always pass here (the handlers check their order against the state, since a request is
        dispatched when it arrives and handled a moment later); everything else needs a completed
        authentication whose session has not expired (KIP-368)."""
        if api_key in (API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE):
            return self.state is not State.FAILED
        if not self.authenticated:
            return False
        return self.session_expires is None or time.monotonic() < self.session_expires

    def handshake(self, mechanism: str) -> int:
        """The SaslHandshake answer's error code; NONE moves to AUTHENTICATE."""
        if self.state not in (State.HANDSHAKE, State.DONE):
            self.state = State.FAILED
            return ErrorCode.ILLEGAL_SASL_STATE
        factory = self.mechanisms.get(mechanism)
        if factory is None:
            self.state = State.FAILED
            return ErrorCode.UNSUPPORTED_SASL_MECHANISM
        if self.state is State.DONE:
            if mechanism != self.mechanism:
                self.state = State.FAILED  # KIP-368: a re-authentication keeps its mechanism
                return ErrorCode.UNSUPPORTED_SASL_MECHANISM
            self.reauthenticating = True
        self.mechanism = mechanism
        self._exchange = factory()
        self.state = State.AUTHENTICATE
        return ErrorCode.NONE

    def authenticate(self, token: bytes) -> tuple[int, str | None, bytes, int]:
        """(error code, error message, server bytes, session lifetime ms) of one SaslAuthenticate."""
        if self.state is not State.AUTHENTICATE or self._exchange is None:
            self.state = State.FAILED
            return ErrorCode.ILLEGAL_SASL_STATE, "Unexpected SaslAuthenticate request", b"", 0
        if len(token) > self.max_receive:
            self.state = State.FAILED
            return (ErrorCode.SASL_AUTHENTICATION_FAILED,
                    f"SASL token of {len(token)} bytes is larger than sasl.server.max.receive.size", b"", 0)
        try:
            out = self._exchange.step(token)
        except AuthenticationFailed as exc:
            self.state = State.FAILED
            return ErrorCode.SASL_AUTHENTICATION_FAILED, str(exc), b"", 0
        if not self._exchange.complete:
            return ErrorCode.NONE, None, out, 0
        principal = self._exchange.principal
        if self.reauthenticating and principal != self.principal:
            self.state = State.FAILED
            return (ErrorCode.SASL_AUTHENTICATION_FAILED,
                    f"Cannot change principals during re-authentication from {self.principal}: {principal}", b"", 0)
        self.principal = principal
        self.state, self.reauthenticating = State.DONE, False
        lifetime = self._lifetime_ms(self._exchange.credential_expires_ms)
        self.session_expires = time.monotonic() + lifetime / 1000 if lifetime else None
        self._exchange = None
        return ErrorCode.NONE, None, out, lifetime

    def _lifetime_ms(self, credential_expires_ms: int | None) -> int:
        """KIP-368: min(connections.max.reauth.ms, the credential's remaining life); 0 means none."""
        limits = []
        if self.max_reauth_ms > 0:
            limits.append(self.max_reauth_ms)
        if credential_expires_ms is not None:
            limits.append(max(1, credential_expires_ms - int(time.time() * 1000)))
        return min(limits) if limits else 0
