"""The `oncelog` data source's options, named and interpreted like Spark's Kafka source.

Pipelines move between `format("kafka")` and `format("oncelog")` by changing the format name, so the options
keep Spark's names and meanings: `kafka.bootstrap.servers` (or `bootstrap.servers`), exactly one of `subscribe`,
`subscribePattern` (a regular expression found in a topic's name, as Spark's Kafka source applies it) and `assign`,
`startingOffsets` / `endingOffsets` as "earliest" / "latest" / per-partition JSON (-2 earliest, -1 latest),
positions by record time (`startingTimestamp`, `startingOffsetsByTimestamp`, `endingTimestamp`,
`endingOffsetsByTimestamp`, `startingOffsetsByTimestampStrategy`, with Spark's precedence: one timestamp over
per-partition timestamps over offsets), `maxOffsetsPerTrigger`, `failOnDataLoss`, `includeHeaders`. Two deliberate differences: the
isolation level defaults to read_committed (Spark's connector defaults to read_uncommitted, which shows aborted
data), and it may be given as `isolation.level` as well as `kafka.isolation.level`. Other `kafka.*` options are
client settings with Kafka's names, validated by `oncelog.client.ClientConfig` where the client is built.

Spark lower-cases option names (`CaseInsensitiveDict`), so every lookup here is by lower-case name and every
error names the option the way the documentation spells it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from oncelog.client.config import ClientConfig

EARLIEST = -2
LATEST = -1



@dataclass(frozen=True)
class ByTimestamp:
    """A position by record time: each partition at its first record whose timestamp is at or after the given
    one (Kafka's ListOffsets by timestamp), one timestamp for every partition read or one per partition."""

    option: str  # the option it came from, as the documentation spells it, for error messages
    everywhere: int | None = None
    per_partition: dict[str, dict[int, int]] | None = None


#: A starting or ending position: "earliest", "latest", {topic: {partition: offset or EARLIEST/LATEST}}, or a
#: position by time that the driver turns into offsets when it plans (topics.at_times)
OffsetSpec = Literal["earliest", "latest"] | dict[str, dict[int, int]] | ByTimestamp

_CLIENT_PREFIX = "kafka."
# kafka.* settings the source decides itself: a value from the user would break the read's guarantees.
_RESERVED_CLIENT_KEYS = {
    "group.id": "the oncelog source reads assigned partitions and commits no offsets",
    "enable.auto.commit": "the oncelog source commits no offsets",
    "auto.offset.reset": "use startingOffsets / endingOffsets",
    "key.deserializer": "keys are always binary",
    "value.deserializer": "values are always binary",
}
_ISOLATION_LEVELS = ("read_committed", "read_uncommitted")


class OptionError(ValueError):
    """An option is missing, malformed or not allowed for this kind of query; the message says which."""


def admin_settings(client: Mapping[str, Any], bootstrap: str, role: str) -> dict[str, Any]:
    """The part of `client` (settings validated for a `role` client) that an admin client takes, plus the
    bootstrap servers: names resolved the client's way (`sasl.mechanisms` is `sasl.mechanism`, ...) and the
    other role's settings left out. Filtering the names as given would silently drop an alias."""
    derived = ClientConfig({**client, "bootstrap.servers": bootstrap}, role).derive("admin")
    settings = {k: v for k, v in derived.explicit().items() if k != "bootstrap.servers"}
    return {**settings, "bootstrap.servers": bootstrap}


@dataclass(frozen=True)
class ReadOptions:
    bootstrap_servers: str
    #: topics to read every partition of (`subscribe`), or None when `assign` names partitions
    topics: tuple[str, ...] | None
    #: {topic: partitions} from `assign`, or None with `subscribe`
    assigned: dict[str, tuple[int, ...]] | None
    starting: OffsetSpec
    ending: OffsetSpec
    max_offsets_per_trigger: int | None
    fail_on_data_loss: bool
    include_headers: bool
    read_committed: bool
    #: Kafka client settings from `kafka.*` options (bootstrap and isolation level excluded)
    client: dict[str, str] = field(default_factory=dict)
    #: `subscribePattern`: every non-internal topic whose name the expression is found in, again every micro-batch
    pattern: str | None = None
    #: `startingOffsetsByTimestampStrategy`: a starting timestamp with no record at or after it in a partition
    #: fails the query ("error") or starts that partition at its end ("latest")
    missing_timestamp: Literal["error", "latest"] = "error"

    @property
    def isolation_level(self) -> str:
        return "read_committed" if self.read_committed else "read_uncommitted"

    def client_config(self) -> dict[str, str]:
        """Settings for an oncelog.client object: the user's `kafka.*` ones plus the bootstrap servers."""
        return {**self.client, "bootstrap.servers": self.bootstrap_servers}


def parse_read_options(options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    """Validate `options` (keys as Spark passes them: any case) for a batch or a streaming read."""
    opts = {str(k).lower(): str(v) for k, v in options.items()}
    bootstrap = opts.get("kafka.bootstrap.servers") or opts.get("bootstrap.servers")
    if not bootstrap:
        raise OptionError("option 'kafka.bootstrap.servers' (or 'bootstrap.servers') is required, "
                          "e.g. '127.0.0.1:9092'")
    topics, assigned, pattern = _subscription(opts)
    starting = (_time_spec(opts, "startingTimestamp", "startingOffsetsByTimestamp")
                or _offset_spec(opts, "startingoffsets", "startingOffsets",
                                default="earliest" if not streaming else "latest"))
    for name in ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp"):
        if name.lower() in opts and streaming:
            raise OptionError(f"option '{name}' is for batch queries only; a streaming read has no end")
    ending = (_time_spec(opts, "endingTimestamp", "endingOffsetsByTimestamp")
              or _offset_spec(opts, "endingoffsets", "endingOffsets", default="latest"))
    strategy = opts.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise OptionError(f"option 'startingOffsetsByTimestampStrategy' must be error or latest; got {strategy!r}")
    if not streaming:
        if starting == "latest" or (isinstance(starting, dict) and _has(starting, LATEST)):
            raise OptionError("option 'startingOffsets': 'latest' (-1) is not allowed for batch queries")
        if ending == "earliest" or (isinstance(ending, dict) and _has(ending, EARLIEST)):
            raise OptionError("option 'endingOffsets': 'earliest' (-2) is not allowed for batch queries")
    max_offsets = None
    if "maxoffsetspertrigger" in opts:
        if not streaming:
            raise OptionError("option 'maxOffsetsPerTrigger' is for streaming queries only")
        max_offsets = _positive_int(opts["maxoffsetspertrigger"], "maxOffsetsPerTrigger")
    isolation = _isolation(opts)
    client = {}
    for key, value in opts.items():
        if not key.startswith(_CLIENT_PREFIX):
            continue
        name = key[len(_CLIENT_PREFIX):]
        if name in ("bootstrap.servers", "isolation.level"):
            continue
        if name in _RESERVED_CLIENT_KEYS:
            raise OptionError(f"option '{key}' is not supported: {_RESERVED_CLIENT_KEYS[name]}")
        client[name] = value
    try:  # a misspelt or producer-only setting fails here, named, instead of being dropped by the reader
        ClientConfig({**client, "bootstrap.servers": bootstrap}, "consumer")
    except ValueError as exc:
        raise OptionError(f"a kafka.* option is not a valid consumer setting: {exc}") from None
    return ReadOptions(
        bootstrap_servers=bootstrap,
        topics=topics,
        assigned=assigned,
        starting=starting,
        ending=ending,
        max_offsets_per_trigger=max_offsets,
        fail_on_data_loss=_bool(opts.get("failondataloss", "true"), "failOnDataLoss"),
        include_headers=_bool(opts.get("includeheaders", "false"), "includeHeaders"),
        read_committed=isolation == "read_committed",
        client=client,
        pattern=pattern,
        missing_timestamp="latest" if strategy == "latest" else "error",
    )


def _subscription(opts: dict[str, str]) -> tuple[tuple[str, ...] | None, dict[str, tuple[int, ...]] | None,
                                                 str | None]:
    given = [name for name in ("subscribe", "assign", "subscribepattern") if name in opts]
    if len(given) != 1:
        raise OptionError("exactly one of the options 'subscribe', 'subscribePattern' and 'assign' is required"
                          + (" (got more than one)" if len(given) > 1 else ""))
    if given[0] == "subscribe":
        topics = tuple(t.strip() for t in opts["subscribe"].split(",") if t.strip())
        if not topics:
            raise OptionError("option 'subscribe' names no topic")
        return tuple(dict.fromkeys(topics)), None, None
    if given[0] == "subscribepattern":
        text = opts["subscribepattern"]
        try:
            re.compile(text)
        except re.error as exc:
            raise OptionError(f"option 'subscribePattern' is not a regular expression ({exc}): {text!r}") from None
        if not text:
            raise OptionError("option 'subscribePattern' is empty")
        return None, None, text
    try:
        raw = json.loads(opts["assign"])
    except json.JSONDecodeError as exc:
        raise OptionError(f"option 'assign' is not JSON ({exc}); expected e.g. "
                          "'{\"topicA\":[0,1],\"topicB\":[2]}'") from None
    if not isinstance(raw, dict) or not raw or not all(
            isinstance(t, str) and isinstance(ps, list) and ps and all(_is_int(p) and p >= 0 for p in ps)
            for t, ps in raw.items()):
        raise OptionError(f"option 'assign' must map each topic to a non-empty list of partitions, e.g. "
                          f"'{{\"topicA\":[0,1]}}'; got {opts['assign']!r}")
    return None, {t: tuple(sorted(set(ps))) for t, ps in raw.items()}, None


def _offset_spec(opts: dict[str, str], key: str, name: str, default: str) -> OffsetSpec:
    text = opts.get(key, default).strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()  # type: ignore[return-value]
    try:
        raw = json.loads(text)
    except json.JSONDecodeError:
        raise OptionError(f"option '{name}' must be 'earliest', 'latest' or JSON like "
                          f"'{{\"topicA\":{{\"0\":23,\"1\":-2}}}}'; got {text!r}") from None
    spec = _partition_map(raw, EARLIEST)
    if spec is None:
        raise OptionError(f"option '{name}' JSON must map topics to {{partition: offset}} with offsets >= 0, "
                          f"or -2 (earliest) / -1 (latest); got {text!r}")
    return spec


def _time_spec(opts: dict[str, str], everywhere: str, per_partition: str) -> ByTimestamp | None:
    """The position by time the options give, if any: one timestamp wins over per-partition ones (Spark)."""
    if everywhere.lower() in opts:
        text = opts[everywhere.lower()].strip()
        if not text.isdigit():
            raise OptionError(f"option '{everywhere}' must be a timestamp in milliseconds since the epoch, "
                              f"e.g. '1700000000000'; got {text!r}")
        return ByTimestamp(everywhere, everywhere=int(text))
    if per_partition.lower() in opts:
        text = opts[per_partition.lower()].strip()
        try:
            spec = _partition_map(json.loads(text), 0)
        except json.JSONDecodeError:
            spec = None
        if spec is None:
            raise OptionError(f"option '{per_partition}' must be JSON mapping topics to {{partition: timestamp "
                              f"in ms}}, e.g. '{{\"topicA\":{{\"0\":1700000000000}}}}'; got {text!r}")
        return ByTimestamp(per_partition, per_partition=spec)
    return None


def _partition_map(raw: object, minimum: int) -> dict[str, dict[int, int]] | None:
    """{topic: {partition: integer >= minimum}} from parsed JSON, or None when it is not that shape."""
    if not isinstance(raw, dict) or not raw:
        return None
    spec: dict[str, dict[int, int]] = {}
    for topic, parts in raw.items():
        if not isinstance(parts, dict) or not parts:
            return None
        spec[topic] = {}
        for partition, value in parts.items():
            if not (str(partition).isdigit() and _is_int(value) and value >= minimum):
                return None
            spec[topic][int(partition)] = value
    return spec


def _isolation(opts: dict[str, str]) -> str:
    plain, prefixed = opts.get("isolation.level"), opts.get("kafka.isolation.level")
    if plain is not None and prefixed is not None and plain.lower() != prefixed.lower():
        raise OptionError(f"options 'isolation.level' ({plain!r}) and 'kafka.isolation.level' ({prefixed!r}) "
                          "disagree")
    level = (plain or prefixed or "read_committed").lower()
    if level not in _ISOLATION_LEVELS:
        raise OptionError(f"option 'isolation.level' must be read_committed or read_uncommitted; got {level!r}")
    return level


def _bool(text: str, name: str) -> bool:
    lowered = text.strip().lower()
    if lowered not in ("true", "false"):
        raise OptionError(f"option '{name}' must be true or false; got {text!r}")
    return lowered == "true"


def _positive_int(text: str, name: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise OptionError(f"option '{name}' must be a positive integer; got {text!r}") from None
    if value <= 0:
        raise OptionError(f"option '{name}' must be a positive integer; got {value}")
    return value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _has(spec: dict[str, dict[int, int]], offset: int) -> bool:
    return any(o == offset for parts in spec.values() for o in parts.values())
