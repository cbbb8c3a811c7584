"""The error table must match an independent copy of Kafka's numbers (kafka-python's)."""

import kafka.errors as kerrors

from oncelog.errors import ErrorCode

# kafka-python keeps some older Kafka names for the same numbers.
_NAME_ALIASES = {
    "UNKNOWN": "UNKNOWN_SERVER_ERROR",
    "NO_ERROR": "NONE",
    "NOT_LEADER_FOR_PARTITION": "NOT_LEADER_OR_FOLLOWER",
    "MESSAGE_SIZE_TOO_LARGE": "MESSAGE_TOO_LARGE",
    "INVALID_TOPIC": "INVALID_TOPIC_EXCEPTION",
    "INVALID_REPLICATION_ASSIGNMENT": "INVALID_REPLICA_ASSIGNMENT",
}
# Where kafka-python's retriable flag differs from the Java client's exception hierarchy,
# which is the reference: CorruptRecordException is a RetriableException in Java.
_RETRIABLE_EXCEPTIONS = {"CORRUPT_MESSAGE"}


def _kafka_python_codes() -> dict[int, type]:
    out = {}
    for name in dir(kerrors):
        cls = getattr(kerrors, name)
        if isinstance(cls, type) and issubclass(cls, kerrors.BrokerResponseError):
            if isinstance(getattr(cls, "errno", None), int):
                out.setdefault(cls.errno, cls)
    return out


def test_every_code_matches_kafka_python():
    theirs = _kafka_python_codes()
    for code in ErrorCode:
        assert code.value in theirs, code
        their_name = theirs[code.value].message
        assert _NAME_ALIASES.get(their_name, their_name) == code.name, (code, their_name)


def test_retriable_flags_match_kafka_python():
    theirs = _kafka_python_codes()
    mismatches = [
        code.name for code in ErrorCode
        if code.value in theirs and bool(theirs[code.value].retriable) != code.retriable
    ]
    assert sorted(mismatches) == ["CORRUPT_MESSAGE"]
    assert ErrorCode.CORRUPT_MESSAGE.retriable
