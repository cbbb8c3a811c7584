"""Client configuration: Kafka's dotted key names, typed, validated once, with defaults per role.

Users come from confluent-kafka and the Java client and bring their dicts along, and
Spark options and the CLI hand every value over as a string; so keys are Kafka's
names (plus the librdkafka aliases people actually use), values are parsed from
strings, and every mistake is a `ValueError` naming the key, raised at construction
rather than deep inside a send loop.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ClientConfig", "ROLES", "keys_for_role", "parse_bootstrap_servers"]

ROLES = ("producer", "consumer", "admin")
_ALL = frozenset(ROLES)
_PRODUCER = frozenset({"producer"})
_CONSUMER = frozenset({"consumer"})

_MAX_INT32 = 2**31 - 1


@dataclass(frozen=True)
class _Key:
    name: str
    kind: str  # "int" | "bool" | "str" | "upper" | "list" | "servers" | "acks" | "callable"
    default: Any
    roles: frozenset[str]
    minimum: int | None = None
    maximum: int | None = None
    choices: tuple[str, ...] | None = None
    nullable: bool = False


def _int(name: str, default: int | None, roles: frozenset[str], minimum: int | None = 0,
         maximum: int | None = _MAX_INT32, nullable: bool = False) -> _Key:
    return _Key(name, "int", default, roles, minimum, maximum, nullable=nullable)


def _str(name: str, default: str | None, roles: frozenset[str], choices: tuple[str, ...] | None = None) -> _Key:
    return _Key(name, "str", default, roles, choices=choices, nullable=default is None)


def _bool(name: str, default: bool, roles: frozenset[str]) -> _Key:
    return _Key(name, "bool", default, roles)


_KEYS: dict[str, _Key] = {k.name: k for k in [
    # common
    _Key("bootstrap.servers", "servers", None, _ALL),
    _str("client.id", "oncelog-python", _ALL),
    _int("request.timeout.ms", 30000, _ALL, minimum=1),
    _int("socket.connection.setup.timeout.ms", 10000, _ALL, minimum=1),
    _int("retry.backoff.ms", 100, _ALL),
    _int("retry.backoff.max.ms", 1000, _ALL),
    _int("reconnect.backoff.ms", 50, _ALL),
    _int("reconnect.backoff.max.ms", 1000, _ALL),
    _int("metadata.max.age.ms", 300000, _ALL, minimum=1),
    _Key("allow.auto.create.topics", "bool", None, _ALL),  # None: the role's default, see below
    # security (client/security.py): librdkafka's names, and the Java client's PEM spellings
    _Key("security.protocol", "upper", "PLAINTEXT", _ALL,
         choices=("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")),
    _str("ssl.ca.location", None, _ALL),
    _str("ssl.certificate.location", None, _ALL),
    _str("ssl.key.location", None, _ALL),
    _str("ssl.key.password", None, _ALL),
    _str("ssl.endpoint.identification.algorithm", "https", _ALL),
    _bool("enable.ssl.certificate.verification", True, _ALL),
    _str("ssl.truststore.type", None, _ALL),
    _str("ssl.truststore.location", None, _ALL),
    _str("ssl.truststore.certificates", None, _ALL),
    _str("ssl.truststore.password", None, _ALL),  # accepted for Java configs; PEM trust stores have none
    _str("ssl.keystore.type", None, _ALL),
    _str("ssl.keystore.location", None, _ALL),
    _str("ssl.keystore.certificate.chain", None, _ALL),
    _str("ssl.keystore.key", None, _ALL),
    _str("ssl.keystore.password", None, _ALL),  # accepted for Java configs; the key's is ssl.key.password
    _str("sasl.mechanism", None, _ALL),
    _str("sasl.username", None, _ALL),
    _str("sasl.password", None, _ALL),
    _str("sasl.jaas.config", None, _ALL),
    _str("sasl.oauthbearer.token", None, _ALL),
    _str("sasl.oauthbearer.config", None, _ALL),
    _str("sasl.oauthbearer.extensions", None, _ALL),
    _Key("oauth_cb", "callable", None, _ALL, nullable=True),
    # producer
    _Key("acks", "acks", -1, _PRODUCER),
    _Key("enable.idempotence", "bool", True, _PRODUCER),
    _str("transactional.id", None, _PRODUCER),
    _int("transaction.timeout.ms", 60000, _PRODUCER, minimum=1),
    _int("linger.ms", 5, _PRODUCER),
    _int("batch.size", 1000000, _PRODUCER, minimum=1),
    _int("batch.num.messages", 10000, _PRODUCER, minimum=1),
    _str("compression.type", "none", _PRODUCER, choices=("none", "gzip", "snappy", "lz4", "zstd")),
    _int("max.in.flight.requests.per.connection", 5, _PRODUCER, minimum=1),
    _int("delivery.timeout.ms", 120000, _PRODUCER, minimum=1),
    _int("retries", _MAX_INT32, _PRODUCER),
    _int("message.max.bytes", 1000000, _PRODUCER, minimum=1000),
    _int("queue.buffering.max.messages", 100000, _PRODUCER, minimum=1),
    _int("queue.buffering.max.kbytes", 1048576, _PRODUCER, minimum=1),
    _str("partitioner", "murmur2_random", _PRODUCER, choices=("murmur2_random", "murmur2", "random")),
    _int("oncelog.test.initial.sequence", 0, _PRODUCER),
    # consumer
    _str("group.id", None, _CONSUMER),
    _str("group.instance.id", None, _CONSUMER),
    _str("auto.offset.reset", "latest", _CONSUMER, choices=("latest", "earliest", "error")),
    _bool("enable.auto.commit", True, _CONSUMER),
    _int("auto.commit.interval.ms", 5000, _CONSUMER, minimum=1),
    _str("isolation.level", "read_committed", _CONSUMER, choices=("read_committed", "read_uncommitted")),
    _int("session.timeout.ms", 45000, _CONSUMER, minimum=1),
    _int("heartbeat.interval.ms", 3000, _CONSUMER, minimum=1),
    _int("max.poll.interval.ms", 300000, _CONSUMER, minimum=1),
    _int("max.poll.records", 500, _CONSUMER, minimum=1),
    _int("fetch.min.bytes", 1, _CONSUMER),
    _int("fetch.max.bytes", 52428800, _CONSUMER, minimum=1),
    _int("fetch.wait.max.ms", 500, _CONSUMER),
    _int("max.partition.fetch.bytes", 1048576, _CONSUMER, minimum=1),
    _Key("partition.assignment.strategy", "list", ("range", "roundrobin"), _CONSUMER,
         choices=("range", "roundrobin")),
    _bool("enable.partition.eof", False, _CONSUMER),
]}

#: librdkafka / older Kafka spellings, stored under the Kafka name.
_ALIASES = {
    "request.required.acks": "acks",
    "queue.buffering.max.ms": "linger.ms",
    "compression.codec": "compression.type",
    "max.in.flight": "max.in.flight.requests.per.connection",
    "message.timeout.ms": "delivery.timeout.ms",
    "topic.metadata.refresh.interval.ms": "metadata.max.age.ms",
    "fetch.max.wait.ms": "fetch.wait.max.ms",
    "sasl.mechanisms": "sasl.mechanism",
    "sasl.user": "sasl.username",
}

#: values never printed (repr, error messages)
_SECRETS = frozenset({"sasl.password", "ssl.key.password", "sasl.oauthbearer.token", "sasl.jaas.config",
                      "ssl.keystore.key", "ssl.keystore.password", "ssl.truststore.password"})

_OFFSET_RESET_ALIASES = {"smallest": "earliest", "beginning": "earliest", "largest": "latest", "end": "latest"}

_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})


def keys_for_role(role: str) -> list[str]:
    """Every key `role` accepts (not counting aliases), in table order."""
    return [name for name, key in _KEYS.items() if role in key.roles]


def parse_bootstrap_servers(value: Any) -> list[tuple[str, int]]:
    """"host:port,host:port" (or a list of such strings) as [(host, port)]; 9092 when no port is given.

    IPv6 literals are written "[::1]:9092", as Kafka does.
    """
    items = value.split(",") if isinstance(value, str) else list(value)
    servers: list[tuple[str, int]] = []
    for item in items:
        item = str(item).strip()
        if not item:
            continue
        if "://" in item:  # "PLAINTEXT://host:port", as found in server.properties listeners
            item = item.split("://", 1)[1]
        if item.startswith("["):
            host, _, rest = item[1:].partition("]")
            port_text = rest[1:] if rest.startswith(":") else ""
        elif item.count(":") == 1:
            host, port_text = item.split(":")
        else:
            host, port_text = item, ""
        try:
            port = int(port_text) if port_text else 9092
        except ValueError:
            raise ValueError(f"bootstrap.servers: bad port in {item!r}") from None
        if not host or not 0 < port < 65536:
            raise ValueError(f"bootstrap.servers: bad address {item!r}")
        servers.append((host, port))
    if not servers:
        raise ValueError("bootstrap.servers: no broker address given")
    return servers


def _parse(key: _Key, value: Any) -> Any:
    name = key.name
    if value is None:
        if key.nullable:
            return None
        raise ValueError(f"{name}: a value is required")
    kind = key.kind
    if kind == "callable":
        if not callable(value):
            raise ValueError(f"{name}: expected a function, got {type(value).__name__}")
        return value
    if kind == "upper":
        text = str(value).strip().upper()
        if key.choices and text not in key.choices:
            raise ValueError(f"{name}: {value!r} is not one of {', '.join(key.choices)}")
        return text
    if kind == "servers":
        return parse_bootstrap_servers(value)
    if kind == "acks":
        text = str(value).strip().lower()
        if text == "all":
            return -1
        try:
            acks = int(text)
        except ValueError:
            raise ValueError(f"acks: expected all, -1, 0 or 1, got {value!r}") from None
        if acks not in (-1, 0, 1):
            raise ValueError(f"acks: expected all, -1, 0 or 1, got {value!r}")
        return acks
    if kind == "bool":
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise ValueError(f"{name}: expected true or false, got {value!r}")
    if kind == "int":
        if isinstance(value, bool):
            raise ValueError(f"{name}: expected an integer, got {value!r}")
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        try:
            number = value if isinstance(value, int) else int(str(value).strip())
        except ValueError:
            raise ValueError(f"{name}: expected an integer, got {value!r}") from None
        if key.minimum is not None and number < key.minimum:
            raise ValueError(f"{name}: {number} is below the minimum {key.minimum}")
        if key.maximum is not None and number > key.maximum:
            raise ValueError(f"{name}: {number} is above the maximum {key.maximum}")
        return number
    if kind == "list":
        items = value.split(",") if isinstance(value, str) else list(value)
        result = tuple(str(item).strip().lower() for item in items if str(item).strip())
        if not result:
            raise ValueError(f"{name}: at least one value is required")
        for item in result:
            if key.choices and item not in key.choices:
                raise ValueError(f"{name}: {item!r} is not one of {', '.join(key.choices)}")
        return list(result)
    text = str(value)
    if name == "auto.offset.reset":
        text = _OFFSET_RESET_ALIASES.get(text.lower(), text.lower())
    elif key.choices:
        text = text.lower()
    if key.choices and text not in key.choices:
        raise ValueError(f"{name}: {value!r} is not one of {', '.join(key.choices)}")
    return text


class ClientConfig:
    """One role's validated configuration. Values are read as ``config["linger.ms"]`` or ``config.linger_ms``."""

    def __init__(self, conf: Mapping[str, Any] | None, role: str) -> None:
        if role not in ROLES:
            raise ValueError(f"unknown client role {role!r} (expected one of {', '.join(ROLES)})")
        self.role = role
        self._explicit: dict[str, Any] = {}
        for raw_name, value in (conf or {}).items():
            if not isinstance(raw_name, str):
                raise ValueError(f"configuration keys are strings, got {raw_name!r}")
            name = _ALIASES.get(raw_name, raw_name)
            key = _KEYS.get(name)
            if key is None:
                raise ValueError(f"unknown configuration property {raw_name!r}")
            if role not in key.roles:
                owners = " and ".join(sorted(key.roles))
                raise ValueError(f"configuration property {raw_name!r} is for a {owners}, not a {role}")
            if name in self._explicit and raw_name != name:
                raise ValueError(f"configuration property {name!r} is given twice (as {raw_name!r} too)")
            self._explicit[name] = _parse(key, value)
        self._values: dict[str, Any] = {}
        for name in keys_for_role(role):
            key = _KEYS[name]
            value = self._explicit[name] if name in self._explicit else key.default
            self._values[name] = list(value) if key.kind == "list" else value
        if self._values["bootstrap.servers"] is None:
            raise ValueError("bootstrap.servers: required (e.g. 'localhost:9092')")
        if self._values["allow.auto.create.topics"] is None:
            self._values["allow.auto.create.topics"] = role == "producer"
        self._check_combinations()

    def _check_combinations(self) -> None:
        v = self._values
        if v["retry.backoff.max.ms"] < v["retry.backoff.ms"]:
            v["retry.backoff.max.ms"] = v["retry.backoff.ms"]
        if v["reconnect.backoff.max.ms"] < v["reconnect.backoff.ms"]:
            v["reconnect.backoff.max.ms"] = v["reconnect.backoff.ms"]
        if self.role == "producer":
            self._check_producer(v)
        elif self.role == "consumer":
            if v["heartbeat.interval.ms"] >= v["session.timeout.ms"]:
                raise ValueError("heartbeat.interval.ms must be lower than session.timeout.ms")
            if v["group.instance.id"] is not None and v["group.id"] is None:
                raise ValueError("group.instance.id requires group.id")

    def _check_producer(self, v: dict[str, Any]) -> None:
        explicit = self._explicit
        if v["acks"] != -1:
            if explicit.get("enable.idempotence") is True:
                raise ValueError(f"enable.idempotence=true requires acks=all, got acks={v['acks']}")
            # Java's rule: idempotence is on by default, but an explicit weaker acks turns it off.
            v["enable.idempotence"] = False
        if v["transactional.id"] is not None:
            if not v["transactional.id"]:
                raise ValueError("transactional.id: must not be empty")
            if not v["enable.idempotence"]:
                raise ValueError("transactional.id requires enable.idempotence=true and acks=all")
        if v["batch.size"] > v["message.max.bytes"]:
            if "batch.size" in explicit:
                raise ValueError(
                    f"batch.size ({v['batch.size']}) exceeds message.max.bytes ({v['message.max.bytes']})")
            v["batch.size"] = v["message.max.bytes"]
        if v["delivery.timeout.ms"] < v["linger.ms"] + v["request.timeout.ms"]:
            if "delivery.timeout.ms" in explicit:
                raise ValueError("delivery.timeout.ms must be at least linger.ms + request.timeout.ms")
            v["delivery.timeout.ms"] = v["linger.ms"] + v["request.timeout.ms"]

    # -- access -----------------------------------------------------------------------------------

    def __getitem__(self, key: str) -> Any:
        name = _ALIASES.get(key, key)
        try:
            return self._values[name]
        except KeyError:
            raise KeyError(f"{key!r} is not a {self.role} configuration property") from None

    def __getattr__(self, attr: str) -> Any:
        # Only called for names that are not real attributes: config.linger_ms -> config["linger.ms"].
        if attr.startswith("_"):
            raise AttributeError(attr)
        values = self.__dict__.get("_values", {})
        name = attr.replace("_", ".")
        if name in values:
            return values[name]
        raise AttributeError(f"{attr!r}: no {self.role} configuration property {name!r}")

    def __contains__(self, key: object) -> bool:
        """True when the user set `key` (under its name or an alias)."""
        return isinstance(key, str) and _ALIASES.get(key, key) in self._explicit

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def get(self, key: str, default: Any = None) -> Any:
        name = _ALIASES.get(key, key)
        return self._values.get(name, default)

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)

    def explicit(self) -> dict[str, Any]:
        """Only the keys the user set, parsed: what a copy of this config for another role should carry."""
        return dict(self._explicit)

    def derive(self, role: str, overrides: Mapping[str, Any] | None = None,
               drop_foreign: bool = True) -> ClientConfig:
        """A config for another role from this one's explicit keys (e.g. the admin client a CLI command needs).

        Keys the other role does not accept are dropped when `drop_foreign`.
        """
        conf: dict[str, Any] = {}
        for name, value in self._explicit.items():
            if drop_foreign and role not in _KEYS[name].roles:
                continue
            conf[name] = ",".join(f"{h}:{p}" for h, p in value) if name == "bootstrap.servers" else value
        conf.update(overrides or {})
        return ClientConfig(conf, role)

    # typed shortcuts for the keys every module reads

    @property
    def bootstrap_servers(self) -> list[tuple[str, int]]:
        return list(self._values["bootstrap.servers"])

    @property
    def client_id(self) -> str:
        return self._values["client.id"]

    @property
    def request_timeout_ms(self) -> int:
        return self._values["request.timeout.ms"]

    def __repr__(self) -> str:
        shown = {k: ("[redacted]" if k in _SECRETS else v) for k, v in self._explicit.items()}
        return f"ClientConfig(role={self.role!r}, {shown!r})"

