"""security/quotas.py: Kafka's precedence of client quotas, its Rate and throttle time, AlterClientQuotas and
DescribeClientQuotas validation, connection limits, and the quota store's persistence."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from oncelog.security import quotas as quotas_module
from oncelog.security.quotas import (
    CLIENT_ID,
    CONNECTION_CREATION_RATE,
    CONSUMER_BYTE_RATE,
    CONTROLLER_MUTATION_RATE,
    INVALID_REQUEST,
    IP,
    LONG_MAX,
    NONE,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    UNSUPPORTED_VERSION,
    USER,
    ClientQuotaManager,
    ClientQuotaManagers,
    ConnectionQuotas,
    LocalQuotaStore,
    QuotaAlteration,
    QuotaEntity,
    QuotaFilter,
    QuotaFilterError,
    QuotaStore,
    QuotaStoreError,
    Rate,
    applicable_quota,
    decode_quotas,
    encode_quotas,
    java_round,
    normal_ip,
    parse_ip_overrides,
    quota_user,
    record_and_throttle,
    throttle_time_ms,
    validate_alterations,
)

P = PRODUCER_BYTE_RATE


def entity(user: object = "-", client: object = "-", ip: object = "-") -> QuotaEntity:
    """An entity; "-" leaves the part out, None is the default."""
    parts = {t: n for t, n in ((USER, user), (CLIENT_ID, client), (IP, ip)) if n != "-"}
    return QuotaEntity.of(parts)


# the eight levels of ClientQuotaManager's order, most specific first, for user alice and client id app
LEVELS = [
    entity("alice", "app"),   # 1 /config/users/alice/clients/app
    entity("alice", None),    # 2 /config/users/alice/clients/<default>
    entity("alice"),          # 3 /config/users/alice
    entity(None, "app"),      # 4 /config/users/<default>/clients/app
    entity(None, None),       # 5 /config/users/<default>/clients/<default>
    entity(None),             # 6 /config/users/<default>
    entity(client="app"),     # 7 /config/clients/app
    entity(client=None),      # 8 /config/clients/<default>
]


# -- precedence ----------------------------------------------------------------------------------------------------------
def test_the_eight_levels_apply_most_specific_first():
    configured = {e: {P: float(level)} for level, e in enumerate(LEVELS, 1)}
    for level in range(1, 9):
        _, limit = applicable_quota(configured, P, "alice", "app")
        assert limit == level, LEVELS[level - 1].path
        del configured[LEVELS[level - 1]]
    assert applicable_quota(configured, P, "alice", "app") == (("", "app"), None)


def test_paths_name_the_levels_as_kafka_does():
    assert [e.path for e in LEVELS] == [
        "users/alice/clients/app", "users/alice/clients/<default>", "users/alice", "users/<default>/clients/app",
        "users/<default>/clients/<default>", "users/<default>", "clients/app", "clients/<default>"]


def test_metric_tags_say_who_shares_a_rate():
    # a user quota: every client id of the user together
    assert applicable_quota({entity("alice"): {P: 10.0}}, P, "alice", "x")[0] == ("alice", "")
    # a user's default-client quota: each client id of the user on its own
    assert applicable_quota({entity("alice", None): {P: 10.0}}, P, "alice", "x")[0] == ("alice", "x")
    # a client-id quota: that client id of every user together
    assert applicable_quota({entity(client="x"): {P: 10.0}}, P, "bob", "x") == (("", "x"), 10.0)
    # a default user quota: each user on its own, with the default's limit
    assert applicable_quota({entity(None): {P: 7.0}}, P, "bob", "x") == (("bob", ""), 7.0)


def test_a_default_user_quota_applies_to_a_user_without_its_own():
    configured = {entity("alice"): {P: 100.0}, entity(None): {P: 5.0}}
    assert applicable_quota(configured, P, "alice", "c")[1] == 100.0
    assert applicable_quota(configured, P, "bob", "c")[1] == 5.0
    assert applicable_quota(configured, P, "ANONYMOUS", "")[1] == 5.0


def test_user_quotas_win_over_client_quotas_and_keys_are_separate():
    configured = {entity(client="app"): {P: 1.0, CONSUMER_BYTE_RATE: 2.0}, entity("alice"): {CONSUMER_BYTE_RATE: 3.0}}
    assert applicable_quota(configured, P, "alice", "app")[1] == 1.0
    assert applicable_quota(configured, CONSUMER_BYTE_RATE, "alice", "app")[1] == 3.0
    assert applicable_quota(configured, CONSUMER_BYTE_RATE, "bob", "app")[1] == 2.0


def test_an_empty_client_id_falls_back_as_in_kafka():
    # Kafka's quotaLimit looks at user-only quotas when the client-id tag is empty, even from level 2
    configured = {entity("alice", None): {P: 1.0}, entity("alice"): {P: 2.0}}
    assert applicable_quota(configured, P, "alice", "")[1] == 2.0
    assert applicable_quota(configured, P, "alice", "x")[1] == 1.0


def test_ip_entities_are_not_client_quotas():
    assert applicable_quota({entity(ip=None): {CONNECTION_CREATION_RATE: 3.0}}, P, "a", "b")[1] is None


def test_quota_user_is_the_principal_name():
    assert quota_user("User:alice") == "alice"
    assert quota_user("User:ANONYMOUS") == "ANONYMOUS"
    assert quota_user("User:CN=x,OU=y:z") == "CN=x,OU=y:z"


# -- Rate and throttle time ------------------------------------------------------------------------------------------------
def test_a_fresh_rate_counts_samples_minus_one_whole_windows():
    rate = Rate(11, 1000)
    rate.record(1000, 0)
    assert rate.window_size_ms(0) == 10_000
    assert rate.measure(0) == pytest.approx(100.0)
    assert rate.window_size_ms(2500) == 10_500  # 2500 elapsed: 2 whole windows, 8 more assumed
    assert rate.measure(2500) == pytest.approx(1000 / 10.5)
    assert rate.window_size_ms(10_200) == 10_200  # 10 whole windows elapsed: the elapsed time


def test_the_rate_is_over_the_elapsed_time_once_the_window_is_full():
    rate = Rate(2, 1000)
    for t in range(0, 3000, 100):
        rate.record(100, t)
    # samples of [2000, 3000) and [1000, 2000) plus the one overlapping the window: 1000..2900
    assert rate.window_size_ms(2900) == 1900
    assert rate.measure(2900) == pytest.approx(2000 / 1.9)


def test_samples_without_events_for_the_whole_window_are_dropped():
    rate = Rate(3, 1000)
    rate.record(5000, 0)
    assert rate.measure(2999) > 0
    assert rate.measure(3000) == 0.0  # its last event is samples * window old


def test_throttle_time_is_kafkas_formula():
    assert throttle_time_ms(300, 200, 10_000) == 5000  # X = (O - T) / T * W
    assert throttle_time_ms(200.005, 200, 20) == 0 and throttle_time_ms(200.025, 200, 20) == 0
    assert java_round(2.5) == 3 and java_round(-2.5) == -2 and java_round(0.49) == 0
    assert throttle_time_ms(1, 0, 1000) == LONG_MAX


def test_record_and_throttle_returns_the_delay_that_brings_the_rate_back():
    rate = Rate(11, 1000)
    assert record_and_throttle(rate, 10_000, 1000, 0) == 0  # 1000/s over the assumed 10 s: at the bound
    delay = record_and_throttle(rate, 10_000, 1000, 0)  # 2000/s over 10 s
    assert delay == 10_000 == throttle_time_ms(rate.measure(0), 1000, rate.window_size_ms(0))
    assert record_and_throttle(rate, 5_000, 1000, 4_000) == 15_000  # 25000 B over 10 s: (2500-1000)/1000 * 10 s


def test_connection_throttles_are_bounded_by_the_window():
    rate = Rate(11, 1000)
    rate.record(1000, 0)
    assert record_and_throttle(rate, 1, 1, 0, max_ms=1000) == 1000


def test_a_steady_client_converges_to_the_quota():
    """A client that sends 5 pipelined 16 KiB requests, then waits out the largest throttle, as a muted channel
    makes it: over 20 s it moves the quota's worth of bytes, within 2% (the start's allowance included)."""
    rate, quota, now, sent = Rate(2, 1000), 200_000, 0.0, 0
    while now < 20_000:
        delays = [record_and_throttle(rate, 16384, quota, now) for _ in range(5)]
        sent += 5 * 16384
        now += max(max(delays), 5)
    assert sent / (now / 1000) == pytest.approx(quota, rel=0.02)


# -- the quota manager -------------------------------------------------------------------------------------------------------
def test_manager_throttles_on_its_own_key_and_unrecords():
    managers = ClientQuotaManagers(samples=11, window_seconds=1)
    assert not managers.produce.enabled and not managers.fetch.enabled
    managers.update({entity("alice"): {P: 1000.0}})
    assert managers.produce.enabled and not managers.fetch.enabled
    produce = managers.produce
    assert produce.record("alice", "a", 10_000, 0) == (0, ("alice", ""))
    assert produce.record("alice", "b", 10_000, 0) == (10_000, ("alice", ""))  # the user's client ids share a rate
    produce.unrecord("alice", "b", 10_000, 0)
    assert produce.record("bob", "a", 1_000_000, 0) == (0, ("", "a"))  # no quota applies to bob
    assert produce.max_value_in_window("alice", "x") == 10_000
    assert produce.max_value_in_window("bob", "x") == float("inf")


def test_a_changed_quota_applies_to_the_rate_recorded_so_far():
    manager = ClientQuotaManager(P, "Produce", 11, 1)
    manager.update({entity(client="c"): {P: 1000.0}})
    assert manager.record("u", "c", 9_000, 0)[0] == 0
    manager.update({entity(client="c"): {P: 500.0}})
    assert manager.record("u", "c", 1_000, 0)[0] == 10_000  # 1000/s against 500/s: (1000-500)/500 * 10 s
    manager.update({})
    assert not manager.enabled


def test_inactive_rates_are_dropped_after_an_hour():
    manager = ClientQuotaManager(P, "Produce", 11, 1)
    manager.update({entity(None): {P: 1.0}})
    manager.record("u1", "c", 1, 0)
    manager.record("u2", "c", 1, 3_600_000)
    manager.record("u2", "c", 1, 3_660_001)
    assert set(manager._rates) == {("u2", "")}


# -- AlterClientQuotas validation --------------------------------------------------------------------------------------------
def alter(entity_: QuotaEntity, *ops: tuple[str, float | None]) -> QuotaAlteration:
    return QuotaAlteration(entity_, tuple(ops))


def errors(alterations, current=None, ip_valid=lambda name: True):
    results, changes = validate_alterations(alterations, current or {}, ip_valid)
    return {e.path or str(e): (r.code, r.message) for e, r in results.items()}, changes


def test_valid_alterations_and_their_changes():
    alice = entity("alice")
    results, changes = errors([alter(alice, (P, 1024.0), (CONSUMER_BYTE_RATE, None))],
                              current={alice: {CONSUMER_BYTE_RATE: 5.0}})
    assert results == {"users/alice": (NONE, None)}
    assert changes == [(alice, P, 1024.0), (alice, CONSUMER_BYTE_RATE, None)]
    # no change: the same value again, removing what is not set
    assert errors([alter(alice, (P, 1024.0), (CONSUMER_BYTE_RATE, None))], current={alice: {P: 1024.0}})[1] == []


@pytest.mark.parametrize(("alteration", "message"), [
    (alter(QuotaEntity.of({}), (P, 1.0)), "Invalid empty client quota entity"),
    (alter(QuotaEntity.of({"group": "g"}), (P, 1.0)), "Unhandled client quota entity type: group"),
    (alter(entity(""), (P, 1.0)), "Empty user not supported"),
    (alter(entity("a", ip="1.2.3.4"), (CONNECTION_CREATION_RATE, 1.0)),
     "Invalid quota entity combination, IP entity shouldnot be combined with User or ClientId"),
    (alter(entity("a"), ("buffer_memory", 1.0)), "Invalid configuration key buffer_memory"),
    (alter(entity(ip="1.2.3.4"), (P, 1.0)), "Invalid configuration key producer_byte_rate"),
    (alter(entity("a"), (P, 0.0)), "Quota producer_byte_rate must be greater than 0"),
    (alter(entity("a"), (P, -5.0)), "Quota producer_byte_rate must be greater than 0"),
    (alter(entity("a"), (P, 1.5)), "producer_byte_rate cannot be a fractional value."),
    (alter(entity("a"), (P, 1e19)), "Proposed value for producer_byte_rate is too large for a LONG."),
    (alter(entity(ip=None), (CONNECTION_CREATION_RATE, 3e9)),
     "Proposed value for connection_creation_rate is too large for an INT."),
])
def test_kafkas_refusals(alteration, message):
    results, changes = errors([alteration])
    assert list(results.values()) == [(INVALID_REQUEST, message)]
    assert changes == []


def test_request_percentage_is_enforced_and_its_throttle_bounded_by_one_window():
    assert errors([alter(entity("a"), (REQUEST_PERCENTAGE, 50.5))])[0] == {"users/a": (NONE, None)}
    managers = ClientQuotaManagers(samples=2, window_seconds=1)
    managers.update({entity("a"): {REQUEST_PERCENTAGE: 1.0}})
    assert managers.request.enabled and not managers.produce.enabled
    # 10 s of loop time at once against 1 %: a byte-rate quota would throttle for minutes, a request quota at
    # most one window (ClientRequestQuotaManager.throttleTime)
    throttle, tags = managers.request.record("a", "app", 1000.0, 5000.0)
    assert (throttle, tags) == (1000, ("a", ""))


@pytest.mark.parametrize(("alteration", "key"), [
    (alter(entity(client="c"), (CONTROLLER_MUTATION_RATE, 10.0)), CONTROLLER_MUTATION_RATE),
    (alter(entity(ip="10.0.0.1"), (CONNECTION_CREATION_RATE, 10.0)), CONNECTION_CREATION_RATE),
])
def test_keys_oncelog_does_not_enforce_are_refused_not_ignored(alteration, key):
    ((code, message),) = errors([alteration])[0].values()
    assert code == INVALID_REQUEST and message.startswith(f"oncelog does not enforce {key} yet")
    # removing one is fine (nothing is set)
    assert list(errors([alter(alteration.entity, (key, None))])[0].values()) == [(NONE, None)]


def test_a_bad_op_changes_nothing_of_its_entity_but_others_apply():
    a, b = entity("a"), entity("b")
    results, changes = errors([alter(a, (P, 10.0), (CONSUMER_BYTE_RATE, 0.5)), alter(b, (P, 20.0))])
    assert results["users/a"] == (INVALID_REQUEST, "consumer_byte_rate cannot be a fractional value.")
    assert results["users/b"] == (NONE, None)
    assert changes == [(b, P, 20.0)]


def test_duplicates_answer_as_kafkas_controller():
    a = entity("a", "c")
    results, changes = errors([alter(a, (P, 10.0), (P, 20.0))])
    assert results == {"users/a/clients/c": (
        INVALID_REQUEST, "Ignoring duplicate entity ClientQuotaEntity(entries={user=a, client-id=c})")}
    assert changes == []
    # the same entity twice: the first entry applies, the answer is about the second
    results, changes = errors([alter(a, (P, 10.0)), alter(QuotaEntity.of([(CLIENT_ID, "c"), (USER, "a")]), (P, 5.0))])
    assert results["users/a/clients/c"][0] == INVALID_REQUEST
    assert changes == [(a, P, 10.0)]


def test_an_ip_that_does_not_resolve_is_refused():
    results, _ = errors([alter(entity(ip="nowhere.invalid"), (CONNECTION_CREATION_RATE, None))],
                        ip_valid=lambda name: False)
    assert list(results.values()) == [(INVALID_REQUEST, "nowhere.invalid is not a valid IP or resolvable host.")]


# -- DescribeClientQuotas filters --------------------------------------------------------------------------------------------
CONFIGURED = [entity("alice"), entity("alice", "app"), entity(None), entity(None, None), entity(client="app"),
              entity(ip="10.0.0.1")]


def described(components, strict=False):
    quota_filter = QuotaFilter.parse(components, strict)
    return [e.path for e in CONFIGURED if quota_filter.matches(e)]


def test_filters_match_as_kafka():
    assert described([]) == [e.path for e in CONFIGURED]
    assert described([], strict=True) == []
    assert described([(USER, 0, "alice")]) == ["users/alice", "users/alice/clients/app"]
    assert described([(USER, 0, "alice")], strict=True) == ["users/alice"]
    assert described([(USER, 1, None)]) == ["users/<default>", "users/<default>/clients/<default>"]
    assert described([(USER, 1, None), (CLIENT_ID, 1, None)], strict=True) == ["users/<default>/clients/<default>"]
    assert described([(USER, 2, None)], strict=True) == ["users/alice", "users/<default>"]
    assert described([(CLIENT_ID, 2, None)]) == ["users/alice/clients/app", "users/<default>/clients/<default>",
                                                  "clients/app"]
    assert described([(IP, 2, None)]) == ["ips/10.0.0.1"]


@pytest.mark.parametrize(("components", "code", "message"), [
    ([("", 0, "x")], INVALID_REQUEST, "Invalid empty entity type."),
    ([(USER, 0, "a"), (USER, 2, None)], INVALID_REQUEST, "Entity type user cannot appear more than once in the filter."),
    ([("group", 0, "g")], UNSUPPORTED_VERSION, "Unsupported entity type group"),
    ([(USER, 0, None)], INVALID_REQUEST, "Request specified MATCH_TYPE_EXACT, but set match string to null."),
    ([(USER, 1, "a")], INVALID_REQUEST, "Request specified MATCH_TYPE_DEFAULT, but also specified a match string."),
    ([(USER, 2, "a")], INVALID_REQUEST, "Request specified MATCH_TYPE_SPECIFIED, but also specified a match string."),
    ([(USER, 7, None)], INVALID_REQUEST, "Unknown match type 7"),
    ([(IP, 2, None), (CLIENT_ID, 0, "c")], INVALID_REQUEST, "Invalid entity filter component combination. IP filter "
                                                            "component should not be used with user or clientId "
                                                            "filter component."),
])
def test_filter_refusals(components, code, message):
    with pytest.raises(QuotaFilterError) as caught:
        QuotaFilter.parse(components, False)
    assert (caught.value.code, caught.value.message) == (code, message)


# -- connection limits -------------------------------------------------------------------------------------------------------
def test_per_ip_limits_and_overrides():
    quotas = ConnectionQuotas(max_per_ip=2, overrides={"10.0.0.9": 3, "::ffff:10.0.0.8": 0})
    assert [quotas.admit("10.0.0.1") for _ in range(3)] == [None, None, 2]
    quotas.release("10.0.0.1")
    assert quotas.admit("10.0.0.1") is None
    assert [quotas.admit("10.0.0.9") for _ in range(4)] == [None, None, None, 3]
    assert quotas.admit("10.0.0.8") == 0
    assert not ConnectionQuotas().limits_ips and ConnectionQuotas().admit("x") is None


def test_addresses_are_compared_in_one_spelling():
    assert normal_ip("::ffff:127.0.0.1") == "127.0.0.1"
    assert normal_ip("0:0:0:0:0:0:0:1") == "::1"
    assert normal_ip("not-an-ip") == "not-an-ip"


def test_ip_overrides_parse_as_kafkas_csv_map():
    assert parse_ip_overrides("hostName:100, 127.0.0.1:200,::1:5") == {"hostName": 100, "127.0.0.1": 200, "::1": 5}
    assert parse_ip_overrides("") == {}
    for bad in ("host", ":3", "h:x"):
        with pytest.raises(ValueError):
            parse_ip_overrides(bad)


def test_creation_rate_queues_connections_as_kafkas_blocked_acceptor():
    quotas = ConnectionQuotas(max_creation_rate=10, samples=2, window_seconds=1)
    delays = [quotas.creation_delay_ms(0) for _ in range(13)]
    # ten within the rate, then each waits 100 ms behind the one before it: 10 a second
    assert delays[:10] == [0] * 10
    assert delays[10:] == [100, 200, 300]
    assert ConnectionQuotas().creation_delay_ms(0) == 0


def test_a_connection_never_waits_more_than_a_window_for_its_own_throttle():
    quotas = ConnectionQuotas(max_creation_rate=0, samples=11, window_seconds=1)
    assert quotas.creation_delay_ms(0) == 1000
    assert quotas.creation_delay_ms(0) == 2000  # behind the first


# -- the store ---------------------------------------------------------------------------------------------------------------
@pytest.fixture
def path(tmp_path):
    return tmp_path / "__oncelog_meta" / "quotas.json"


def test_store_satisfies_the_protocol_and_starts_empty(path):
    store = LocalQuotaStore(path)
    assert isinstance(store, QuotaStore)
    assert store.load() == {}


def test_quotas_survive_a_new_store_and_the_listener_sees_every_change(path):
    seen = []
    store = LocalQuotaStore(path, seen.append)
    a, d = entity("alice", "app"), entity(None)
    store.alter([(a, P, 1024.0), (d, CONSUMER_BYTE_RATE, 2048.0)])
    store.alter([(d, CONSUMER_BYTE_RATE, None)])
    assert LocalQuotaStore(path).load() == {a: {P: 1024.0}}
    assert seen == [{a: {P: 1024.0}, d: {CONSUMER_BYTE_RATE: 2048.0}}, {a: {P: 1024.0}}]
    assert store.describe(QuotaFilter.parse([(USER, 0, "alice")], False)) == [(a, {P: 1024.0})]
    doc = json.loads(path.read_text())
    assert doc == {"version": 1, "entries": [{"entity": {"user": "alice", "client-id": "app"},
                                               "quotas": {"producer_byte_rate": 1024.0}}]}


def test_a_default_is_null_in_the_file_not_a_name(path):
    store = LocalQuotaStore(path)
    store.alter([(entity(None), P, 1.0), (entity("<default>"), P, 2.0)])
    loaded = LocalQuotaStore(path).load()
    assert loaded == {entity(None): {P: 1.0}, entity("<default>"): {P: 2.0}}


def test_every_write_is_fsynced_and_renamed(path, monkeypatch):
    calls = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (calls.append("rename"), real_replace(a, b))[1])
    LocalQuotaStore(path).alter([(entity("a"), P, 1.0)])
    assert calls == ["fsync", "fsync", "rename", "fsync"]  # the new directory into its parent, the file, its directory
    calls.clear()
    LocalQuotaStore(path).alter([(entity("b"), P, 1.0)])
    assert calls == ["fsync", "rename", "fsync"]


def test_a_failed_write_changes_nothing(path, monkeypatch):
    seen = []
    store = LocalQuotaStore(path, seen.append)
    store.alter([(entity("a"), P, 1.0)])

    def crash(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        store.alter([(entity("b"), P, 2.0)])
    monkeypatch.undo()
    assert store.describe(QuotaFilter.parse([], False)) == [(entity("a"), {P: 1.0})]
    assert LocalQuotaStore(path).load() == {entity("a"): {P: 1.0}}
    assert len(seen) == 1


def test_a_leftover_temp_file_is_ignored(path):
    LocalQuotaStore(path).alter([(entity("a"), P, 1.0)])
    (path.parent / (path.name + ".tmp")).write_text("{torn")
    assert LocalQuotaStore(path).load() == {entity("a"): {P: 1.0}}


@pytest.mark.parametrize(("content", "why"), [
    (b"{", "not JSON"),
    (b'{"version": 2, "entries": []}', "not a version 1"),
    (b'{"version": 1, "entries": [{"entity": {"user": "a"}}]}', "entry 0"),
    (b'{"version": 1, "entries": [{"entity": {"user": "a"}, "quotas": {"producer_byte_rate": -1}}]}',
     "must be greater than 0"),
    (b'{"version": 1, "entries": [{"entity": {"user": "a"}, "quotas": {"controller_mutation_rate": 5}}]}',
     "does not enforce controller_mutation_rate"),
    (b'{"version": 1, "entries": [{"entity": {"user": "a", "ip": "1.1.1.1"}, "quotas": {"producer_byte_rate": 1}}]}',
     "IP entity"),
    (b'{"version": 1, "entries": [{"entity": {"user": "a"}, "quotas": {"producer_byte_rate": 1}}, '
     b'{"entity": {"user": "a"}, "quotas": {"consumer_byte_rate": 1}}]}', "appears twice"),
])
def test_an_unreadable_file_is_an_error_not_an_empty_list(path, content, why):
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    with pytest.raises(QuotaStoreError, match=why):
        LocalQuotaStore(path).load()


def test_encoding_round_trips():
    quotas = {entity("é", None): {P: 1.0, CONSUMER_BYTE_RATE: 9e15}, entity(client="c:1"): {P: 3.0}}
    assert decode_quotas(encode_quotas(quotas), "test") == quotas


CHILD = textwrap.dedent("""
    import sys
    from oncelog.security.quotas import LocalQuotaStore, QuotaEntity
    store = LocalQuotaStore(sys.argv[1])
    i = 0
    while True:
        store.alter([(QuotaEntity.of({"client-id": f"c{i}"}), "producer_byte_rate", float(i + 1))])
        print(i, flush=True)
        i += 1
""")


def test_quotas_survive_sigkill_mid_stream(path):
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        last = -1
        while last < 30:
            line = proc.stdout.readline()
            assert line, "the writer died"
            last = int(line)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stored = LocalQuotaStore(path).load()
    # whole, and at least everything acknowledged before the kill
    assert stored == {QuotaEntity.of({"client-id": f"c{i}"}): {P: float(i + 1)} for i in range(len(stored))}
    assert len(stored) >= last + 1


def test_the_module_imports_nothing_of_the_broker():
    source = open(quotas_module.__file__).read()
    assert "from ..broker" not in source and "from ..cluster" not in source


# -- the broker connection's mute (KIP-219) against its backpressure ------------------------------------------------------
class _Transport:
    def __init__(self) -> None:
        self.reading = True
        self.closing = False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 5555) if name == "peername" else default

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True


class _Host:
    def __init__(self, queued: int) -> None:
        self.config = {"socket.request.max.bytes": 1 << 20, "queued.max.requests": queued,
                       "oncelog.authentication.timeout.ms": 30_000}
        self.dispatcher = self
        self.futures: list = []

    def dispatch(self, conn, frame, fut, seq) -> None:
        self.futures.append(fut)

    def register_connection(self, conn) -> bool:
        return True

    def unregister_connection(self, conn) -> None:
        pass


def test_a_muted_connection_reads_again_only_when_neither_mute_nor_backpressure_holds_it():
    """(Lower bounds on time only: a loaded machine makes every wait longer, never shorter.)"""
    import asyncio

    from oncelog.broker.connection import Connection

    async def main() -> None:
        loop = asyncio.get_running_loop()
        host, transport = _Host(queued=2), _Transport()
        conn = Connection(host)
        conn.connection_made(transport)
        began = loop.time()
        conn.mute_for(0.05)
        assert not transport.reading and conn.muted
        conn.mute_for(0.01)  # a shorter throttle does not shorten the mute
        conn._deliver(bytearray(b"a"))
        conn._deliver(bytearray(b"b"))  # queued.max.requests reached: backpressure too
        await conn.until_unmuted()
        assert loop.time() - began >= 0.05
        assert not conn.muted and not transport.reading  # the mute ended, backpressure still holds
        host.futures[0].set_result(None)
        host.futures[1].set_result(None)
        for _ in range(5):
            await asyncio.sleep(0)
        assert transport.reading  # both released

        conn._deliver(bytearray(b"c"))
        conn._deliver(bytearray(b"d"))
        conn.mute_for(0.05)
        host.futures[2].set_result(None)
        host.futures[3].set_result(None)
        for _ in range(5):
            await asyncio.sleep(0)
        assert not transport.reading  # backpressure released, the mute still holds
        order: list[str] = []

        async def waiter(name: str) -> None:
            await conn.until_unmuted()
            order.append(name)

        tasks = [asyncio.create_task(waiter(n)) for n in "xyz"]
        extended = loop.time()
        conn.mute_for(0.08)  # extended
        await asyncio.gather(*tasks)
        assert loop.time() - extended >= 0.08
        assert transport.reading and order == ["x", "y", "z"]

        conn.mute_for(10)
        late = asyncio.create_task(waiter("late"))
        await asyncio.sleep(0)
        conn.connection_lost(None)  # a connection that ends lets its waiters go
        await asyncio.wait_for(late, 5)
        assert not transport.reading

    asyncio.run(main())
