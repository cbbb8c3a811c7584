"""Typed client exceptions: every error says whether to retry, abort the transaction, or give up.

The three questions a caller asks of an error (retry it? abort and go on? stop?) are
answered by the exception's class, so application code can write
``except AbortableError: producer.abort_transaction()`` instead of comparing codes.
The classification is the Java client's, with DESIGN.md §4's choices where the seeds
differ (research/protocol-semantics.md §2, §7.2 and §7.4 list the sources).
"""

from __future__ import annotations

from oncelog.errors import ErrorCode

__all__ = [
    "KafkaError",
    "RetriableError",
    "AbortableError",
    "FatalError",
    "NetworkError",
    "RequestTimedOut",
    "UnsupportedVersion",
    "ProducerFenced",
    "DataLossError",
    "RecordError",
    "KafkaTimeoutError",
    "AuthenticationError",
    "SslAuthenticationError",
    "error_for",
    "code_name",
]


def code_name(code: int | None) -> str:
    """The protocol name of an error code; numbers this table does not know stay readable."""
    if code is None:
        return "CLIENT_ERROR"
    try:
        return ErrorCode(code).name
    except ValueError:
        return f"UNKNOWN_CODE_{code}"


def _standard_message(code: int | None) -> str:
    if code is None:
        return ""
    try:
        return ErrorCode(code).message
    except ValueError:
        return f"The broker returned error code {code}, which this client does not know."


class KafkaError(Exception):
    """Base of every client error; `code` is the wire error code, None for errors born in the client."""

    retriable = False
    abortable = False
    fatal = False
    #: the code a subclass stands for when it is raised without one (NetworkError -> NETWORK_EXCEPTION)
    default_code: int | None = None

    def __init__(self, message: str | None = None, code: int | None = None) -> None:
        self.code: int | None = self.default_code if code is None else code
        self.message: str = message or _standard_message(self.code) or type(self).__name__
        super().__init__(self.message)

    @property
    def name(self) -> str:
        return code_name(self.code) if self.code is not None else type(self).__name__

    def __str__(self) -> str:
        if self.code is None:
            return self.message
        return f"{self.name} ({self.code}): {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r})"


class RetriableError(KafkaError):
    """The same request may succeed later (after a metadata refresh or coordinator rediscovery)."""

    retriable = True


class AbortableError(KafkaError):
    """The current transaction cannot commit; abort_transaction() recovers and the producer goes on."""

    abortable = True


class FatalError(KafkaError):
    """The producer or consumer instance cannot go on; close it (and create a new one if you must)."""

    fatal = True


class NetworkError(RetriableError):
    """The connection failed or closed while the request was in flight: the broker may or may not have acted."""

    default_code = int(ErrorCode.NETWORK_EXCEPTION)


class RequestTimedOut(NetworkError):
    """No response within request.timeout.ms; the connection was closed, as its answer order is now unknown."""

    default_code = int(ErrorCode.REQUEST_TIMED_OUT)


class UnsupportedVersion(FatalError):
    """No version of an API that both this client and the broker speak."""

    default_code = int(ErrorCode.UNSUPPORTED_VERSION)


class AuthenticationError(FatalError):
    """The broker refused who we are (SASL) or we refused who it is (TLS): retrying cannot help.

    Raised from the connection attempt with the cause in words (wrong password, untrusted certificate,
    a mechanism the broker does not enable); the client keeps it and fails every later operation with it
    at once, instead of reconnecting in a loop.
    """

    default_code = int(ErrorCode.SASL_AUTHENTICATION_FAILED)


class SslAuthenticationError(AuthenticationError):
    """The TLS handshake failed: the broker's certificate is not trusted, its name does not match, or the
    listener does not speak TLS the way this client was told."""

    default_code = None


class ProducerFenced(FatalError):
    """A newer producer instance with the same transactional.id took over (or the epoch is stale)."""

    default_code = int(ErrorCode.PRODUCER_FENCED)


class DataLossError(FatalError):
    """UNKNOWN_PRODUCER_ID that retention does not explain (seed 004): acknowledged records are gone."""

    default_code = int(ErrorCode.UNKNOWN_PRODUCER_ID)


class RecordError(KafkaError):
    """KIP-467: the broker rejected this one record of a batch; the other records were not at fault."""

    def __init__(self, message: str | None = None, code: int | None = None, batch_index: int = -1) -> None:
        super().__init__(message, code)
        self.batch_index = batch_index

    def __repr__(self) -> str:
        return f"RecordError(code={self.code!r}, batch_index={self.batch_index}, message={self.message!r})"


class KafkaTimeoutError(KafkaError):
    """A client-side deadline passed (delivery.timeout.ms, or the timeout given to a blocking call)."""


_ALWAYS_FATAL: dict[int, type[FatalError]] = {
    ErrorCode.SASL_AUTHENTICATION_FAILED: AuthenticationError,
    ErrorCode.UNSUPPORTED_SASL_MECHANISM: AuthenticationError,
    ErrorCode.ILLEGAL_SASL_STATE: AuthenticationError,
    ErrorCode.UNSUPPORTED_VERSION: UnsupportedVersion,
    ErrorCode.CLUSTER_AUTHORIZATION_FAILED: FatalError,
    ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: FatalError,
    ErrorCode.PRODUCER_FENCED: ProducerFenced,
    # Kafka 4.0 made it fatal (KAFKA-18019): a zombie whose id expired must not process twice (DESIGN §3).
    ErrorCode.INVALID_PRODUCER_ID_MAPPING: FatalError,
    ErrorCode.INVALID_TRANSACTION_TIMEOUT: FatalError,
    ErrorCode.TRANSACTION_COORDINATOR_FENCED: FatalError,
}

# A coordinator's INVALID_PRODUCER_EPOCH means another instance bumped the epoch: fenced. On Produce the
# same code is how a timed-out transaction's owner learns it must abort (DESIGN §3), so there it is abortable.
_COORDINATOR_FATAL: dict[int, type[FatalError]] = {
    ErrorCode.INVALID_PRODUCER_EPOCH: ProducerFenced,
    ErrorCode.INVALID_TXN_STATE: FatalError,
    ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT: FatalError,
}

_RETRIABLE_CLASSES: dict[int, type[RetriableError]] = {
    ErrorCode.NETWORK_EXCEPTION: NetworkError,
    ErrorCode.REQUEST_TIMED_OUT: RequestTimedOut,
}


def _is_retriable(code: int) -> bool:
    try:
        return ErrorCode(code).retriable
    except ValueError:
        return False


def error_for(
    code: int, message: str | None = None, *, transactional: bool = False, coordinator: bool = False
) -> KafkaError | None:
    """The exception for a response's error code, or None for NONE.

    `transactional`: the error ends a transactional producer's transaction, so every
    non-retriable, non-fatal code is abortable. `coordinator`: the answer came from a
    transaction coordinator API (InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn,
    EndTxn, TxnOffsetCommit), where a stale epoch means fenced. UNKNOWN_PRODUCER_ID and
    DUPLICATE_SEQUENCE_NUMBER need the producer's state to judge; the producer decides them.
    """
    if code == 0:
        return None
    message = message or None
    if _is_retriable(code):
        return _RETRIABLE_CLASSES.get(code, RetriableError)(message, code)
    fatal_cls = _ALWAYS_FATAL.get(code)
    if fatal_cls is None and coordinator:
        fatal_cls = _COORDINATOR_FATAL.get(code)
    if fatal_cls is not None:
        return fatal_cls(message, code)
    if transactional:
        return AbortableError(message, code)
    return KafkaError(message, code)
