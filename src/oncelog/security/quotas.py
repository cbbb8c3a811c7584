"""Client quotas (KIP-13, KIP-124, KIP-546) and connection quotas, with Kafka's rules; pure (no broker import).

The entity model. A quota is set on an entity: a user, a client id, a user together with a client id, or an IP
(KIP-546's `ip`), each name either given or the default (`None` here, `null` on the wire, `<default>` in Kafka's
ZooKeeper paths and in what this module prints: /config/users/<default>/clients/app).

Which quota applies to a connection's (user, client id) is Kafka's order (ClientQuotaManager's DefaultQuotaCallback),
most specific first:

    1 /config/users/<user>/clients/<client-id>      5 /config/users/<default>/clients/<default>
    2 /config/users/<user>/clients/<default>        6 /config/users/<default>
    3 /config/users/<user>                          7 /config/clients/<client-id>
    4 /config/users/<default>/clients/<client-id>   8 /config/clients/<default>

and it is found in Kafka's two steps: the first level that has a quota names the *metric tags* (user, client-id,
either possibly ""), which is also what the connections sharing one rate have in common (a user quota meters all
the user's client ids together, a <user, default client> quota each client id on its own); the limit is then
looked up from those tags. Both steps are Kafka's, quirks included (a client with an empty client id falls back
from level 1/2 to the user's own quota). Kafka short-cuts the first step while quotas are set at one level only;
the multi-level path used here gives the same limits in every case.

The rate is Kafka's `Rate` over a `WindowedSum` (SampledStat): `quota.window.num` samples of
`quota.window.size.seconds`, one more kept for the sample overlapping the window's start, the elapsed time
counted as at least `samples - 1` whole windows. A recorded value that takes the rate above the bound is a
violation, and the throttle time is QuotaUtils.throttleTime: X = (O - T) / T * W, the delay that brings the
observed rate O back to the bound T over the window W the rate used. Client byte-rate throttles are not capped (as
Kafka's ClientQuotaManager); connection-creation throttles are capped at one window (ConnectionQuotas).

Stores (`QuotaStore`): the single node keeps `__oncelog_meta/quotas.json` (LocalQuotaStore, replaced atomically:
it survives a SIGKILL); a cluster keeps them in ZooKeeper (cluster/store/quotas.py) behind the same protocol.

What oncelog enforces: producer_byte_rate, consumer_byte_rate and request_percentage (the time a client's requests
hold the event loop: broker/request_quota.py). controller_mutation_rate (topic/partition mutations) and KIP-612's ip
connection_creation_rate are validated as Kafka validates them and then refused (INVALID_REQUEST), never accepted
and ignored: see NOT_ENFORCED.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import math
import os
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ..durable_file import atomic_write, fsync_dir

log = logging.getLogger("oncelog.security.quotas")

INT_MAX = 2147483647
LONG_MAX = 9223372036854775807

# Entity types (ClientQuotaEntity) and Kafka's name of a default entity in ZooKeeper (ZooKeeperInternals).
USER, CLIENT_ID, IP = "user", "client-id", "ip"
ENTITY_TYPES = (USER, CLIENT_ID, IP)
DEFAULT = "<default>"

# Quota keys (QuotaConfig) and their config types: byte rates are LONG, percentages and mutation rates DOUBLE,
# the IP connection rate INT.
PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
CONTROLLER_MUTATION_RATE = "controller_mutation_rate"
CONNECTION_CREATION_RATE = "connection_creation_rate"
USER_CLIENT_KEYS = {PRODUCER_BYTE_RATE: "LONG", CONSUMER_BYTE_RATE: "LONG", REQUEST_PERCENTAGE: "DOUBLE",
                    CONTROLLER_MUTATION_RATE: "DOUBLE"}
IP_KEYS = {CONNECTION_CREATION_RATE: "INT"}

ENFORCED = frozenset({PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE})
NOT_ENFORCED = {
    CONTROLLER_MUTATION_RATE: "topic and partition mutations are not metered",
    CONNECTION_CREATION_RATE: "per-IP connection rates are not metered (max.connection.creation.rate, "
                              "broker-wide, and max.connections.per.ip are)",
}

# DescribeClientQuotas match types.
MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED = 0, 1, 2

# Kafka's error codes used here (oncelog.errors.ErrorCode has the same numbers; this module stays import-free).
NONE, INVALID_REQUEST, UNSUPPORTED_VERSION, UNKNOWN_SERVER_ERROR = 0, 42, 35, -1

# A sensor nobody recorded into for an hour is dropped (ClientQuotaManager.InactiveSensorExpirationTimeSeconds).
INACTIVE_SENSOR_MS = 3600 * 1000


# -- entities ---------------------------------------------------------------------------------------------------------
_ORDER = {t: i for i, t in enumerate(ENTITY_TYPES)}


@dataclass(frozen=True)
class QuotaEntity:
    """(entity type, name or None for the default) pairs, one per type, in user, client-id, ip order (other types,
    which only a request can carry, after them). Equal when the mappings are equal, as Kafka's ClientQuotaEntity."""

    entries: tuple[tuple[str, str | None], ...]

    @classmethod
    def of(cls, mapping: Mapping[str, str | None] | Iterable[tuple[str, str | None]]) -> QuotaEntity:
        """From a mapping or from (type, name) pairs; a type given twice keeps its last name (as Kafka's request
        parsing into a HashMap does)."""
        items = dict(mapping.items() if isinstance(mapping, Mapping) else mapping)
        return cls(tuple(sorted(items.items(), key=lambda kv: (_ORDER.get(kv[0], len(_ORDER)), kv[0]))))

    def as_dict(self) -> dict[str, str | None]:
        return dict(self.entries)

    def __contains__(self, entity_type: str) -> bool:
        return any(t == entity_type for t, _ in self.entries)

    def name(self, entity_type: str) -> str | None:
        return dict(self.entries)[entity_type]

    @property
    def path(self) -> str:
        """Kafka's ZooKeeper layout: users/alice/clients/<default>, clients/app, ips/10.0.0.1."""
        names = self.as_dict()
        parts = []
        for entity_type, folder in ((USER, "users"), (CLIENT_ID, "clients"), (IP, "ips")):
            if entity_type in names:
                parts.append(f"{folder}/{DEFAULT if names[entity_type] is None else names[entity_type]}")
        return "/".join(parts)

    def __str__(self) -> str:
        # ClientQuotaEntity.toString: a Java map of the entries
        inner = ", ".join(f"{t}={'null' if n is None else n}" for t, n in self.entries)
        return f"ClientQuotaEntity(entries={{{inner}}})"


@dataclass(frozen=True)
class ApiError:
    code: int = NONE
    message: str | None = None

    @property
    def failed(self) -> bool:
        return self.code != NONE


OK = ApiError()


def _invalid(message: str) -> ApiError:
    return ApiError(INVALID_REQUEST, message)


def _entity_error(entity: QuotaEntity) -> ApiError | None:
    """ClientQuotaControlManager.validateEntity."""
    if not entity.entries:
        return _invalid("Invalid empty client quota entity")
    for entity_type, name in entity.entries:
        if entity_type not in ENTITY_TYPES:
            return _invalid(f"Unhandled client quota entity type: {entity_type}")
        if name is not None and name == "":
            return _invalid(f"Empty {entity_type} not supported")
    return None


def _config_keys(entity: QuotaEntity, ip_valid: Callable[[str], bool]) -> dict[str, str] | ApiError:
    """ClientQuotaControlManager.configKeysForEntityType: which keys this kind of entity takes."""
    if IP in entity:
        if USER in entity or CLIENT_ID in entity:
            # (Kafka's message, missing space included)
            return _invalid("Invalid quota entity combination, IP entity shouldnot be combined with User or ClientId")
        name = entity.name(IP)
        if name is not None and not ip_valid(name):
            return _invalid(f"{name} is not a valid IP or resolvable host.")
        return IP_KEYS
    if USER in entity or CLIENT_ID in entity:
        return USER_CLIENT_KEYS
    return _invalid("Invalid empty client quota entity")


def validate_value(keys: Mapping[str, str], key: str, value: float) -> ApiError | None:
    """ClientQuotaControlManager.validateQuotaKeyValue, then oncelog's refusal of a key it does not enforce."""
    kind = keys.get(key)
    if kind is None:
        return _invalid(f"Invalid configuration key {key}")
    if not value > 0.0:  # NaN too: Kafka's `value <= 0.0` lets NaN through to a later failure; refuse it here
        return _invalid(f"Quota {key} must be greater than 0")
    if kind == "INT" and value > INT_MAX:
        return _invalid(f"Proposed value for {key} is too large for an INT.")
    if kind == "LONG" and value > LONG_MAX:
        return _invalid(f"Proposed value for {key} is too large for a LONG.")
    if kind in ("INT", "LONG") and abs(math.fmod(value, 1.0)) > 1e-6:
        return _invalid(f"{key} cannot be a fractional value.")
    if key not in ENFORCED:
        return _invalid(f"oncelog does not enforce {key} yet ({NOT_ENFORCED[key]}); it is refused rather than "
                        "accepted and ignored")
    return None


@dataclass(frozen=True)
class QuotaAlteration:
    """One AlterClientQuotas entry: the entity and its ops, (key, value) or (key, None) to remove."""

    entity: QuotaEntity
    ops: tuple[tuple[str, float | None], ...]


Change = tuple[QuotaEntity, str, float | None]  # (entity, key, new value or None: remove)


def validate_alterations(
    alterations: Sequence[QuotaAlteration],
    current: Mapping[QuotaEntity, Mapping[str, float]],
    ip_valid: Callable[[str], bool] = lambda name: True,
) -> tuple[dict[QuotaEntity, ApiError], list[Change]]:
    """Kafka's ClientQuotaControlManager.alterClientQuotas: a result per distinct entity (in first-seen order) and
    the changes to store. An entity with any invalid op changes nothing; a duplicate key in one entry, or an entity
    named twice, answers "Ignoring duplicate entity" for it (an earlier, valid entry of that entity still applies,
    as in Kafka). Removing a key that is not set and setting the value already set are no changes."""
    results: dict[QuotaEntity, ApiError] = {}
    changes: list[Change] = []
    for alteration in alterations:
        entity = alteration.entity
        ops: dict[str, float | None] = {}
        for key, value in alteration.ops:
            if key in ops:
                results[entity] = _invalid(f"Duplicate quota key {key} not updating quota for this entity {entity}")
            else:
                ops[key] = value
        if entity in results:
            results[entity] = _invalid(f"Ignoring duplicate entity {entity}")
            continue
        error = _entity_error(entity)
        keys = _config_keys(entity, ip_valid) if error is None else error
        if isinstance(keys, ApiError):
            results[entity] = keys
            continue
        now = current.get(entity, {})
        mine: list[Change] = []
        for key, value in ops.items():
            if value is None:
                if key in now:
                    mine.append((entity, key, None))
                continue
            error = validate_value(keys, key, value)
            if error is not None:
                results[entity] = error
                break
            if now.get(key) != value:
                mine.append((entity, key, value))
        else:
            changes.extend(mine)
            results[entity] = OK
    return results, changes


def apply_changes(current: Mapping[QuotaEntity, Mapping[str, float]],
                  changes: Iterable[Change]) -> dict[QuotaEntity, dict[str, float]]:
    """The quotas after `changes`; an entity left without keys is gone (ClientQuotaControlManager.replay)."""
    out = {entity: dict(values) for entity, values in current.items()}
    for entity, key, value in changes:
        values = out.setdefault(entity, {})
        if value is None:
            values.pop(key, None)
        else:
            values[key] = float(value)
        if not values:
            del out[entity]
    return out


# -- DescribeClientQuotas filters ---------------------------------------------------------------------------------------
class QuotaFilterError(ValueError):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class QuotaFilter:
    """A parsed DescribeClientQuotas filter: exact names (None: the default) and types that must be present."""

    exact: tuple[tuple[str, str | None], ...]
    specified: frozenset[str]
    strict: bool

    @classmethod
    def parse(cls, components: Iterable[tuple[str, int, str | None]], strict: bool) -> QuotaFilter:
        """(entity type, match type, match) components, checked as Kafka's ClientQuotasImage.describe checks them
        (INVALID_REQUEST, or UNSUPPORTED_VERSION for an unknown entity type)."""
        exact: dict[str, str | None] = {}
        specified: set[str] = set()
        for entity_type, match_type, match in components:
            if not entity_type:
                raise QuotaFilterError(INVALID_REQUEST, "Invalid empty entity type.")
            if entity_type in exact or entity_type in specified:
                raise QuotaFilterError(INVALID_REQUEST,
                                       f"Entity type {entity_type} cannot appear more than once in the filter.")
            if entity_type not in ENTITY_TYPES:
                raise QuotaFilterError(UNSUPPORTED_VERSION, f"Unsupported entity type {entity_type}")
            if match_type == MATCH_EXACT:
                if match is None:
                    raise QuotaFilterError(INVALID_REQUEST,
                                           "Request specified MATCH_TYPE_EXACT, but set match string to null.")
                exact[entity_type] = match
            elif match_type == MATCH_DEFAULT:
                if match is not None:
                    raise QuotaFilterError(INVALID_REQUEST,
                                           "Request specified MATCH_TYPE_DEFAULT, but also specified a match string.")
                exact[entity_type] = None
            elif match_type == MATCH_SPECIFIED:
                if match is not None:
                    raise QuotaFilterError(INVALID_REQUEST, "Request specified MATCH_TYPE_SPECIFIED, but also "
                                                            "specified a match string.")
                specified.add(entity_type)
            else:
                raise QuotaFilterError(INVALID_REQUEST, f"Unknown match type {match_type}")
        named = set(exact) | specified
        if IP in named and (USER in named or CLIENT_ID in named):
            raise QuotaFilterError(INVALID_REQUEST, "Invalid entity filter component combination. IP filter "
                                                    "component should not be used with user or clientId filter "
                                                    "component.")
        return cls(tuple(exact.items()), frozenset(specified), strict)

    def matches(self, entity: QuotaEntity) -> bool:
        names = entity.as_dict()
        if self.strict and len(names) != len(self.exact) + len(self.specified):
            return False
        for entity_type, name in self.exact:
            if entity_type not in names or names[entity_type] != name:
                return False
        return all(t in names for t in self.specified)


# -- the rate: Kafka's Rate over a WindowedSum ---------------------------------------------------------------------------
class _Sample:
    __slots__ = ("value", "events", "start_ms", "last_ms")

    def __init__(self, now_ms: float) -> None:
        self.reset(now_ms)

    def reset(self, now_ms: float) -> None:
        self.value = 0.0
        self.events = 0
        self.start_ms = now_ms
        self.last_ms = now_ms


class Rate:
    """Kafka's `Rate` (per second) of a `WindowedSum`: `samples` samples of `window_ms`, plus the sample that
    overlaps the monitored window's start; times in milliseconds."""

    __slots__ = ("samples", "window_ms", "_ring", "_current", "last_record_ms")

    def __init__(self, samples: int, window_ms: int) -> None:
        self.samples = samples
        self.window_ms = window_ms
        self._ring: list[_Sample] = []
        self._current = 0
        self.last_record_ms = 0.0

    def record(self, value: float, now_ms: float) -> None:
        """SampledStat.record: into the current sample, or a recycled one when the current sample is complete."""
        self.last_record_ms = now_ms
        sample = self._current_sample(now_ms)
        if now_ms - sample.start_ms >= self.window_ms:
            self._current = (self._current + 1) % (self.samples + 1)
            if self._current >= len(self._ring):
                sample = _Sample(now_ms)
                self._ring.append(sample)
            else:
                sample = self._ring[self._current]
                sample.reset(now_ms)
        sample.value += value
        sample.events += 1
        sample.last_ms = now_ms

    def _current_sample(self, now_ms: float) -> _Sample:
        if not self._ring:
            self._ring.append(_Sample(now_ms))
        return self._ring[self._current]

    def _purge(self, now_ms: float) -> None:
        expire = self.samples * self.window_ms
        for sample in self._ring:
            if now_ms - sample.last_ms >= expire:
                sample.reset(now_ms)

    def window_size_ms(self, now_ms: float) -> float:
        """Rate.windowSize: the time since the oldest sample, counted as at least samples - 1 whole windows (so a
        fresh rate is not measured over a few milliseconds), at least 1 ms."""
        self._purge(now_ms)
        if not self._ring:
            self._ring.append(_Sample(now_ms))
        elapsed = now_ms - min(s.start_ms for s in self._ring)
        full = int(elapsed // self.window_ms)
        if full < self.samples - 1:
            elapsed += (self.samples - 1 - full) * self.window_ms
        return max(elapsed, 1)

    def measure(self, now_ms: float) -> float:
        """The rate per second at `now_ms`."""
        self._purge(now_ms)
        total = sum(s.value for s in self._ring)
        return total / (self.window_size_ms(now_ms) / 1000.0)


def java_round(x: float) -> int:
    """Math.round: half up, and +inf to Long.MAX_VALUE."""
    if x == math.inf:
        return LONG_MAX
    return int(math.floor(x + 0.5))


def throttle_time_ms(observed: float, bound: float, window_ms: float) -> int:
    """QuotaUtils.throttleTime: X = (O - T) / T * W, rounded as Java's Math.round."""
    if bound <= 0:
        return LONG_MAX
    return java_round((observed - bound) / bound * window_ms)


def record_and_throttle(rate: Rate, value: float, bound: float, now_ms: float, max_ms: int | None = None) -> int:
    """Sensor.record with its quota checked: record, then 0 if the rate is within `bound`, else the throttle time
    (QuotaUtils.throttleTime; capped at `max_ms` when given, QuotaUtils.boundedThrottleTime)."""
    rate.record(value, now_ms)
    observed = rate.measure(now_ms)
    if observed <= bound:
        return 0
    ms = throttle_time_ms(observed, bound, rate.window_size_ms(now_ms))
    return ms if max_ms is None else min(ms, max_ms)


# -- which quota applies: ClientQuotaManager's DefaultQuotaCallback ---------------------------------------------------------
_ABSENT = object()  # the entity has no such part (a user quota has no client id), unlike a default (None)
Slot = Any  # a name, None (the default), or _ABSENT


def quota_table(quotas: Mapping[QuotaEntity, Mapping[str, float]], key: str) -> dict[tuple[Slot, Slot], float]:
    """One key's quotas by (user slot, client-id slot), the shape the precedence reads."""
    table: dict[tuple[Slot, Slot], float] = {}
    for entity, values in quotas.items():
        if key not in values or IP in entity:
            continue
        names = entity.as_dict()
        table[(names.get(USER, _ABSENT), names.get(CLIENT_ID, _ABSENT))] = values[key]
    return table


def metric_tags(table: Mapping[tuple[Slot, Slot], float], user: str, client_id: str) -> tuple[str, str]:
    """The (user, client-id) tags of the rate a connection records into: DefaultQuotaCallback.quotaMetricTags."""
    if (user, client_id) in table or (user, None) in table:  # 1, 2
        return user, client_id
    if (user, _ABSENT) in table:  # 3
        return user, ""
    if (None, client_id) in table or (None, None) in table:  # 4, 5
        return user, client_id
    if (None, _ABSENT) in table:  # 6
        return user, ""
    return "", client_id  # 7, 8


def quota_limit(table: Mapping[tuple[Slot, Slot], float], tags: tuple[str, str]) -> float | None:
    """The limit of the rate with these tags (DefaultQuotaCallback.quotaLimit); None: no quota."""
    user, client_id = tags
    if user and client_id:
        order = ((user, client_id), (user, None), (None, client_id), (None, None))
    elif user:
        order = ((user, _ABSENT), (None, _ABSENT))
    elif client_id:
        order = ((_ABSENT, client_id), (_ABSENT, None))
    else:
        return None
    for slot in order:
        if slot in table:
            return table[slot]
    return None


def applicable_quota(quotas: Mapping[QuotaEntity, Mapping[str, float]], key: str, user: str,
                     client_id: str) -> tuple[tuple[str, str], float | None]:
    """(metric tags, limit or None) of `key` for a connection of `user` with `client_id`."""
    table = quota_table(quotas, key)
    tags = metric_tags(table, user, client_id)
    return tags, quota_limit(table, tags)


def quota_user(principal: str) -> str:
    """The quota user of a principal: its name (KafkaPrincipal.getName: "User:alice" -> "alice"; an unauthenticated
    connection is User:ANONYMOUS, so "ANONYMOUS")."""
    _, sep, name = principal.partition(":")
    return name if sep else principal


class ClientQuotaManager:
    """One quota type's rates (Kafka's ClientQuotaManager for Produce or Fetch): a Rate per metric tags, the limit
    from the quotas of `key`. `enabled` is False while no quota of `key` is set: the request path tests it and
    does nothing more (Kafka's quotasEnabled; here it turns off again when the last quota goes)."""

    def __init__(self, key: str, quota_type: str, samples: int, window_seconds: int,
                 bounded: bool = False) -> None:
        self.key = key
        self.quota_type = quota_type  # Kafka's QuotaType name, the metric group: "Produce", "Fetch", "Request"
        self.samples = samples
        self.window_ms = window_seconds * 1000
        # Request quotas' throttle is at most one window (ClientRequestQuotaManager.throttleTime); byte rates' not
        self.max_throttle_ms = self.window_ms if bounded else None
        self.enabled = False
        self._table: dict[tuple[Slot, Slot], float] = {}
        self._rates: dict[tuple[str, str], Rate] = {}
        self._resolved: dict[tuple[str, str], tuple[tuple[str, str], float | None]] = {}
        self._next_expiry_ms = 0.0

    def update(self, quotas: Mapping[QuotaEntity, Mapping[str, float]]) -> None:
        """New quotas (all of them): limits change at once, rates recorded so far are kept (Kafka changes the
        quota of an existing sensor in place)."""
        self._table = quota_table(quotas, self.key)
        self._resolved = {}
        self.enabled = bool(self._table)

    def resolve(self, user: str, client_id: str) -> tuple[tuple[str, str], float | None]:
        """(metric tags, limit or None) for a connection's user and client id."""
        found = self._resolved.get((user, client_id))
        if found is None:
            tags = metric_tags(self._table, user, client_id)
            found = (tags, quota_limit(self._table, tags))
            if len(self._resolved) > 10000:
                self._resolved.clear()
            self._resolved[(user, client_id)] = found
        return found

    def _rate(self, tags: tuple[str, str], now_ms: float) -> Rate:
        if now_ms >= self._next_expiry_ms:
            self._next_expiry_ms = now_ms + 60_000
            for stale in [t for t, r in self._rates.items() if now_ms - r.last_record_ms > INACTIVE_SENSOR_MS]:
                del self._rates[stale]
        rate = self._rates.get(tags)
        if rate is None:
            rate = self._rates[tags] = Rate(self.samples, self.window_ms)
        return rate

    def record(self, user: str, client_id: str, value: float, now_ms: float) -> tuple[int, tuple[str, str]]:
        """Kafka's recordAndGetThrottleTimeMs: (throttle time in ms, 0 within the quota; the metric tags)."""
        tags, limit = self.resolve(user, client_id)
        if limit is None:
            return 0, tags
        return record_and_throttle(self._rate(tags, now_ms), value, limit, now_ms, self.max_throttle_ms), tags

    def unrecord(self, user: str, client_id: str, value: float, now_ms: float) -> None:
        """unrecordQuotaSensor: take back a value recorded for a response that was not sent (a throttled fetch)."""
        tags, limit = self.resolve(user, client_id)
        if limit is not None:
            self._rate(tags, now_ms).record(-value, now_ms)

    def max_value_in_window(self, user: str, client_id: str) -> float:
        """getMaxValueInQuotaWindow: the most that can be recorded at once without a certain throttle, quota *
        (samples - 1) * window; what a consumer's fetch is capped at (KAFKA-9677). Infinite without a quota."""
        _, limit = self.resolve(user, client_id)
        if limit is None:
            return math.inf
        return limit * (self.samples - 1) * self.window_ms / 1000


class ClientQuotaManagers:
    """The quota managers a broker enforces with (QuotaFactory's produce, fetch and request)."""

    def __init__(self, samples: int, window_seconds: int) -> None:
        self.produce = ClientQuotaManager(PRODUCER_BYTE_RATE, "Produce", samples, window_seconds)
        self.fetch = ClientQuotaManager(CONSUMER_BYTE_RATE, "Fetch", samples, window_seconds)
        self.request = ClientQuotaManager(REQUEST_PERCENTAGE, "Request", samples, window_seconds, bounded=True)

    def update(self, quotas: Mapping[QuotaEntity, Mapping[str, float]]) -> None:
        self.produce.update(quotas)
        self.fetch.update(quotas)
        self.request.update(quotas)


# -- connection limits: Kafka's ConnectionQuotas ---------------------------------------------------------------------------
def parse_ip_overrides(text: str) -> dict[str, int]:
    """max.connections.per.ip.overrides, "host:count,host:count" (Kafka's Csv.parseCsvMap: the count after the last
    colon, so IPv6 hosts work); ValueError with what is wrong."""
    overrides: dict[str, int] = {}
    for item in (part.strip() for part in (text or "").split(",")):
        if not item:
            continue
        host, sep, count = item.rpartition(":")
        host, count = host.strip(), count.strip()
        if not sep or not host:
            raise ValueError(f"{item!r} is not host:count")
        if not count.lstrip("+").isdigit():
            raise ValueError(f"the count of {host} ({count!r}) is not a whole number")
        overrides[host] = int(count)
    return overrides


def normal_ip(host: str) -> str:
    """An address as one spelling (an IPv4-mapped IPv6 address as its IPv4 address, as Java's InetAddress)."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


class ConnectionQuotas:
    """max.connections.per.ip (with its overrides by address) and max.connection.creation.rate (broker-wide).

    Kafka's acceptor waits, before it takes the next connection, until the broker-wide creation rate is back within
    its bound (ConnectionQuotas.waitForConnectionSlot; each wait at most one quota window): the connections after
    an over-the-rate one wait behind it. Here every connection is accepted at once by the event loop, so the same
    queue is kept by time: a connection is taken at max(now, when the one before it was let go), recorded at that
    time, and let go after its throttle; `creation_delay_ms` says how long it waits unread."""

    def __init__(self, max_per_ip: int = INT_MAX, overrides: Mapping[str, int] | None = None,
                 max_creation_rate: int = INT_MAX, samples: int = 11, window_seconds: int = 1) -> None:
        self.max_per_ip = max_per_ip
        self.overrides = {normal_ip(host): count for host, count in (overrides or {}).items()}
        self.limits_ips = max_per_ip < INT_MAX or bool(self.overrides)
        self.max_creation_rate = max_creation_rate
        self.window_ms = window_seconds * 1000
        self._rate = Rate(samples, self.window_ms) if max_creation_rate < INT_MAX else None
        self._free_at_ms = 0.0
        self.counts: dict[str, int] = {}

    def creation_delay_ms(self, now_ms: float) -> int:
        """Record a new connection against max.connection.creation.rate; how long it must wait before it is read
        (0 within the rate)."""
        if self._rate is None:
            return 0
        start = max(now_ms, self._free_at_ms)
        throttle = record_and_throttle(self._rate, 1.0, self.max_creation_rate, start, max_ms=self.window_ms)
        self._free_at_ms = start + throttle
        return int(math.ceil(self._free_at_ms - now_ms)) if throttle or start > now_ms else 0

    def max_for(self, ip: str) -> int:
        return self.overrides.get(ip, self.max_per_ip)

    def admit(self, ip: str) -> int | None:
        """Count a connection from `ip`; None if admitted, else the limit it would exceed (not counted)."""
        if not self.limits_ips:
            return None
        count = self.counts.get(ip, 0)
        limit = self.max_for(ip)
        if count >= limit:
            return limit
        self.counts[ip] = count + 1
        return None

    def release(self, ip: str) -> None:
        if not self.limits_ips:
            return
        count = self.counts.get(ip, 0)
        if count <= 1:
            self.counts.pop(ip, None)
        else:
            self.counts[ip] = count - 1


# -- stores -----------------------------------------------------------------------------------------------------------------
Quotas = dict[QuotaEntity, dict[str, float]]
QuotaListener = Callable[[Quotas], None]


class QuotaStoreError(ValueError):
    """The stored quotas cannot be read; the message names the file and what is wrong."""


@runtime_checkable
class QuotaStore(Protocol):
    """Where client quotas are kept: a file on the single node, ZooKeeper in a cluster. `alter` stores the changes
    (validated by the caller, `validate_alterations`) durably, then calls the listener with every quota; OSError
    when they could not be stored (nothing changed). It does so at once (the file) or as a coroutine (ZooKeeper;
    callers take either with `security.settled.settled`); `load` and `describe` answer at once, from memory."""

    def load(self) -> Quotas: ...

    def describe(self, quota_filter: QuotaFilter) -> list[tuple[QuotaEntity, dict[str, float]]]: ...

    def alter(self, changes: Sequence[Change]) -> None | Awaitable[None]: ...

    def set_listener(self, listener: QuotaListener | None) -> None: ...


FORMAT_VERSION = 1


def encode_quotas(quotas: Mapping[QuotaEntity, Mapping[str, float]]) -> bytes:
    """The file's JSON: each entity as {type: name}, a default as null (never "<default>": a user may carry that
    name), and its quotas by key."""
    entries = [{"entity": entity.as_dict(), "quotas": dict(sorted(values.items()))}
               for entity, values in quotas.items() if values]
    return (json.dumps({"version": FORMAT_VERSION, "entries": entries}, indent=1) + "\n").encode()


def decode_quotas(data: bytes, source: str) -> Quotas:
    """The quotas of a file written by `encode_quotas`; QuotaStoreError naming `source` for anything else, including
    an entity or value AlterClientQuotas would refuse."""
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise QuotaStoreError(f"quota file {source} is not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("version") != FORMAT_VERSION or not isinstance(doc.get("entries"), list):
        raise QuotaStoreError(f"quota file {source} is not a version {FORMAT_VERSION} quota list")
    quotas: Quotas = {}
    for i, item in enumerate(doc["entries"]):
        try:
            names, values = item["entity"], item["quotas"]
            if not isinstance(names, dict) or not isinstance(values, dict) or not values:
                raise TypeError("entity and quotas must be non-empty objects")
            if not all(isinstance(n, str) or n is None for n in names.values()):
                raise TypeError("entity names must be strings or null")
            entity = QuotaEntity.of(names)
            error = _entity_error(entity)
            keys = _config_keys(entity, lambda name: True) if error is None else error
            if isinstance(keys, ApiError):
                raise ValueError(keys.message)
            parsed = {}
            for key, value in values.items():
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise TypeError(f"{key} is not a number")
                problem = validate_value(keys, key, float(value))
                if problem is not None:
                    raise ValueError(problem.message)
                parsed[key] = float(value)
        except (KeyError, TypeError, ValueError) as exc:
            raise QuotaStoreError(f"quota file {source}, entry {i}: {exc}: {item!r}") from None
        if entity in quotas:
            raise QuotaStoreError(f"quota file {source}, entry {i}: {entity.path} appears twice")
        quotas[entity] = parsed
    return quotas


class LocalQuotaStore:
    """The single node's quotas in one JSON file, replaced atomically (temp file, fsync, rename, directory fsync):
    after a SIGKILL it holds the quotas before a change or after it. Synchronous and locked, as the ACL store:
    AlterClientQuotas is a rare admin request and the file is small."""

    def __init__(self, path: str | os.PathLike, listener: QuotaListener | None = None) -> None:
        self.path = Path(path)
        self._listener = listener
        self._lock = threading.Lock()
        self._quotas: Quotas | None = None

    def set_listener(self, listener: QuotaListener | None) -> None:
        self._listener = listener

    def load(self) -> Quotas:
        """Read the file (none: no quotas); QuotaStoreError if it cannot be read. Does not call the listener."""
        with self._lock:
            return self._copy(self._read())

    @staticmethod
    def _copy(quotas: Quotas) -> Quotas:
        return {entity: dict(values) for entity, values in quotas.items()}

    def _read(self) -> Quotas:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            quotas: Quotas = {}
        else:
            quotas = decode_quotas(data, str(self.path))
        self._quotas = quotas
        return quotas

    def _current(self) -> Quotas:
        return self._quotas if self._quotas is not None else self._read()

    def describe(self, quota_filter: QuotaFilter) -> list[tuple[QuotaEntity, dict[str, float]]]:
        with self._lock:
            return [(entity, dict(values)) for entity, values in self._current().items()
                    if quota_filter.matches(entity)]

    def alter(self, changes: Sequence[Change]) -> None:
        """Store `changes`; on OSError nothing changed (the file may already hold them if only the directory's fsync
        failed: the next change rewrites it from what is current)."""
        if not changes:
            return
        with self._lock:
            new = apply_changes(self._current(), changes)
            parent = self.path.parent
            if not parent.exists():
                parent.mkdir(parents=True, exist_ok=True)
                fsync_dir(parent.parent)
            atomic_write(self.path, encode_quotas(new))
            self._quotas = new
            for entity, key, value in changes:
                log.info("%s quota %s of %s", "Removed" if value is None else f"Set to {value}", key, entity.path)
            if self._listener is not None:
                self._listener(self._copy(new))
