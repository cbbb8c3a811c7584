"""The oncelog source's planning logic without Spark or a broker: options, offsets, ranges, Arrow rows.

These are pure functions of their inputs (that is what makes replays read the same ranges), so they are
tested directly, with the edge cases spelled out: every option error names the option, limits are shared
by backlog and never stall a partition, new partitions start at 0, going backwards is data loss.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pa = pytest.importorskip("pyarrow", reason="the Spark tests need the `spark` extra: pip install -e '.[dev,spark]'")

from oncelog.client.types import message_class  # noqa: E402
from oncelog.spark.offsets import DataLoss, OffsetRange, from_json, limit, plan, resolve, to_json, vanished  # noqa: E402
from oncelog.spark.options import ByTimestamp, OptionError, parse_read_options  # noqa: E402
from oncelog.spark.schema import arrow_schema, spark_ddl, to_record_batch  # noqa: E402

BOOT = {"kafka.bootstrap.servers": "127.0.0.1:9092"}


def test_defaults_follow_spark_kafka_source_except_isolation():
    batch = parse_read_options({**BOOT, "subscribe": "a, b,a"}, streaming=False)
    assert batch.topics == ("a", "b") and batch.assigned is None
    assert (batch.starting, batch.ending) == ("earliest", "latest")
    assert batch.read_committed and batch.fail_on_data_loss and not batch.include_headers
    stream = parse_read_options({**BOOT, "subscribe": "a"}, streaming=True)
    assert stream.starting == "latest" and stream.max_offsets_per_trigger is None


def test_option_names_are_case_insensitive_and_kafka_prefix_is_optional():
    o = parse_read_options({"bootstrap.servers": "h:1", "SUBSCRIBE": "t", "IncludeHeaders": "TRUE",
                            "kafka.isolation.level": "read_uncommitted", "kafka.request.timeout.ms": "5000",
                            "maxOffsetsPerTrigger": "10"}, streaming=True)
    assert o.bootstrap_servers == "h:1" and o.include_headers and not o.read_committed
    assert o.max_offsets_per_trigger == 10
    assert o.client_config() == {"request.timeout.ms": "5000", "bootstrap.servers": "h:1"}


def test_security_settings_reach_every_client_under_any_spelling():
    """Spark lower-cases option names; security settings in the Java client's or librdkafka's spelling (an
    alias such as sasl.mechanisms) reach the consumer, the admin clients and the sink's producer. Filtering the
    names as given dropped the aliases: the read failed asking for GSSAPI, the write refused the option."""
    from oncelog.spark.options import admin_settings
    from oncelog.spark.write_options import parse_write_options

    given = {"kafka.Security.Protocol": "SASL_SSL", "kafka.SASL.Mechanisms": "SCRAM-SHA-512",
             "kafka.sasl.user": "alice", "kafka.sasl.password": "secret", "kafka.ssl.truststore.type": "PEM",
             "kafka.ssl.truststore.location": "/ca.pem"}
    lowered = {k.lower(): v for k, v in given.items()}  # what Spark hands a data source
    wanted = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "alice",
              "sasl.password": "secret", "ssl.truststore.type": "PEM", "ssl.truststore.location": "/ca.pem",
              "bootstrap.servers": "h:1"}
    for options in (given, lowered):
        read = parse_read_options({"bootstrap.servers": "h:1", "subscribe": "t", "kafka.max.poll.records": "7",
                                   **options}, streaming=False)
        assert admin_settings(read.client, read.bootstrap_servers, "consumer") == wanted
        write = parse_write_options({"bootstrap.servers": "h:1", "topic": "t", "kafka.linger.ms": "7", **options})
        assert write.admin_config() == wanted
        producer = write.producer_config("txn")
        assert producer["sasl.mechanisms"] == "SCRAM-SHA-512" and producer["linger.ms"] == "7"
    with pytest.raises(OptionError, match="kafka.acks"):  # reserved under an alias too
        parse_write_options({"bootstrap.servers": "h:1", "kafka.request.required.acks": "1"})
    with pytest.raises(OptionError, match="'group.id' is for a consumer"):
        parse_write_options({"bootstrap.servers": "h:1", "kafka.group.id": "g"})


def test_subscribe_pattern():
    o = parse_read_options({**BOOT, "subscribePattern": "events-.*"}, streaming=True)
    assert (o.topics, o.assigned, o.pattern) == (None, None, "events-.*")


def test_positions_by_time_and_their_precedence():
    o = parse_read_options({**BOOT, "subscribe": "t", "startingTimestamp": "1000",
                            "startingOffsetsByTimestamp": '{"t":{"0":5}}', "startingOffsets": "earliest",
                            "endingOffsetsByTimestamp": '{"t":{"0":9}}', "endingOffsets": "latest"}, streaming=False)
    assert o.starting == ByTimestamp("startingTimestamp", everywhere=1000)
    assert o.ending == ByTimestamp("endingOffsetsByTimestamp", per_partition={"t": {0: 9}})
    assert o.missing_timestamp == "error"
    o = parse_read_options({**BOOT, "subscribe": "t", "startingOffsetsByTimestamp": '{"t":{"0":5}}',
                            "startingOffsetsByTimestampStrategy": "LATEST"}, streaming=True)
    assert o.starting == ByTimestamp("startingOffsetsByTimestamp", per_partition={"t": {0: 5}})
    assert o.missing_timestamp == "latest"


def test_assign_and_offsets_json():
    o = parse_read_options({**BOOT, "assign": json.dumps({"t": [2, 0, 2]}),
                            "startingOffsets": json.dumps({"t": {"0": -2, "2": 7}}),
                            "endingOffsets": json.dumps({"t": {"0": 9, "2": -1}})}, streaming=False)
    assert o.topics is None and o.assigned == {"t": (0, 2)}
    assert o.starting == {"t": {0: -2, 2: 7}} and o.ending == {"t": {0: 9, 2: -1}}


@pytest.mark.parametrize(("options", "streaming", "names"), [
    ({"subscribe": "t"}, False, "kafka.bootstrap.servers"),
    ({**BOOT}, False, "'subscribe', 'subscribePattern' and 'assign'"),
    ({**BOOT, "subscribe": "t", "assign": '{"t":[0]}'}, False, "got more than one"),
    ({**BOOT, "subscribe": "t", "subscribePattern": "t.*"}, False, "got more than one"),
    ({**BOOT, "subscribePattern": "t[.*"}, False, "'subscribePattern' is not a regular expression"),
    ({**BOOT, "assign": "t:0"}, False, "'assign' is not JSON"),
    ({**BOOT, "assign": '{"t":[]}'}, False, "'assign' must map"),
    ({**BOOT, "subscribe": "t", "startingOffsets": "latest"}, False, "'startingOffsets'"),
    ({**BOOT, "subscribe": "t", "endingOffsets": '{"t":{"0":-2}}'}, False, "'endingOffsets'"),
    ({**BOOT, "subscribe": "t", "endingOffsets": "latest"}, True, "batch queries only"),
    ({**BOOT, "subscribe": "t", "startingOffsets": '{"t":{"x":1}}'}, False, "'startingOffsets' JSON"),
    ({**BOOT, "subscribe": "t", "startingOffsets": "first"}, False, "'startingOffsets' must be"),
    ({**BOOT, "subscribe": "t", "startingTimestamp": "-5"}, False, "'startingTimestamp' must be a timestamp"),
    ({**BOOT, "subscribe": "t", "startingOffsetsByTimestamp": '{"t":{"0":-1}}'}, False,
     "'startingOffsetsByTimestamp' must be JSON"),
    ({**BOOT, "subscribe": "t", "endingTimestamp": "5"}, True, "'endingTimestamp' is for batch queries only"),
    ({**BOOT, "subscribe": "t", "endingOffsetsByTimestamp": '{"t":{"0":1}}'}, True, "batch queries only"),
    ({**BOOT, "subscribe": "t", "startingOffsetsByTimestampStrategy": "earliest"}, False,
     "'startingOffsetsByTimestampStrategy' must be error or latest"),
    ({**BOOT, "subscribe": "t", "maxOffsetsPerTrigger": "0"}, True, "'maxOffsetsPerTrigger'"),
    ({**BOOT, "subscribe": "t", "maxOffsetsPerTrigger": "5"}, False, "streaming queries only"),
    ({**BOOT, "subscribe": "t", "failOnDataLoss": "maybe"}, False, "'failOnDataLoss'"),
    ({**BOOT, "subscribe": "t", "isolation.level": "serializable"}, False, "'isolation.level'"),
    ({**BOOT, "subscribe": "t", "isolation.level": "read_committed",
      "kafka.isolation.level": "read_uncommitted"}, False, "disagree"),
    ({**BOOT, "subscribe": "t", "kafka.group.id": "g"}, False, "'kafka.group.id'"),
    ({**BOOT, "subscribe": "t", "kafka.request.timout.ms": "5"}, False, "'request.timout.ms'"),
    ({**BOOT, "subscribe": "t", "kafka.acks": "all"}, False, "'acks' is for a producer"),
    ({**BOOT, "subscribe": "t", "kafka.request.timeout.ms": "soon"}, False, "request.timeout.ms"),
])
def test_option_errors_name_the_option(options, streaming, names):
    with pytest.raises(OptionError) as err:
        parse_read_options(options, streaming=streaming)
    assert names in str(err.value)


def test_offsets_json_round_trip_is_sorted_with_string_partitions():
    offsets = {("b", 1): 5, ("a", 10): 1, ("a", 2): 0}
    data = to_json(offsets)
    assert json.dumps(data) == '{"a": {"2": 0, "10": 1}, "b": {"1": 5}}'
    assert from_json(json.loads(json.dumps(data))) == offsets


def test_resolve_specs():
    tps = [("t", 0), ("t", 1)]
    earliest, latest = {("t", 0): 3, ("t", 1): 0}, {("t", 0): 10, ("t", 1): 4}
    assert resolve("earliest", tps, earliest, latest, "s") == earliest
    assert resolve("latest", tps, earliest, latest, "s") == latest
    assert resolve({"t": {0: -1, 1: 2}}, tps, earliest, latest, "s") == {("t", 0): 10, ("t", 1): 2}
    with pytest.raises(OptionError, match="'startingOffsets'.*missing t-1"):
        resolve({"t": {0: 5}}, tps, earliest, latest, "startingOffsets")
    with pytest.raises(OptionError, match="not read by this query u-0"):
        resolve({"t": {0: 5, 1: 1}, "u": {0: 1}}, tps, earliest, latest, "startingOffsets")


def test_limit_shares_the_budget_by_backlog_and_never_stalls():
    start = {("t", 0): 0, ("t", 1): 100, ("t", 2): 50}
    latest = {("t", 0): 900, ("t", 1): 200, ("t", 2): 50}
    assert limit(start, latest, None) == latest
    assert limit(start, latest, 5000) == latest
    assert limit(start, latest, 100) == {("t", 0): 90, ("t", 1): 110, ("t", 2): 50}
    # A tiny budget still moves every partition with a backlog by one offset.
    assert limit(start, latest, 1) == {("t", 0): 1, ("t", 1): 101, ("t", 2): 50}
    # A partition not in `start` is new: it starts at 0.
    assert limit({}, {("n", 0): 10}, 4) == {("n", 0): 4}


def test_plan_ranges_new_partitions_and_data_loss():
    assert plan({("t", 0): 5, ("t", 1): 7}, {("t", 0): 9, ("t", 1): 7, ("u", 0): 3}, fail_on_data_loss=True) == [
        OffsetRange("t", 0, 5, 9), OffsetRange("u", 0, 0, 3)]
    with pytest.raises(DataLoss, match="t-0 \\(was at 5, now ends at 2\\).*failOnDataLoss=false"):
        plan({("t", 0): 5}, {("t", 0): 2}, fail_on_data_loss=True)
    assert plan({("t", 0): 5}, {("t", 0): 2}, fail_on_data_loss=False) == []
    assert vanished({("t", 0): 1, ("t", 1): 1}, [("t", 0)]) == [("t", 1)]


def test_record_batch_matches_spark_kafka_schema():
    create = message_class("topic", 3, 1, None, True)
    create_plain = message_class("topic", 3, 1, None, False)
    append = message_class("topic", 3, 2, None, False)
    records = [(7, 1_700_000_000_123, b"k", b"v", [("h", b"x"), ("n", None)]),
               (8, 1_700_000_000_124, None, None, []),
               (9, 1_700_000_000_125, b"p", b"q"),
               (10, 1_700_000_000_200, b"k2", b"")]
    kinds = [(0, create), (2, create_plain), (3, append)]
    rb = to_record_batch("topic", 3, records, kinds, include_headers=True)
    assert rb.schema == arrow_schema(True)
    assert rb.column("offset").to_pylist() == [7, 8, 9, 10]
    assert rb.column("topic").to_pylist() == ["topic"] * 4 and rb.column("partition").to_pylist() == [3] * 4
    assert rb.column("key").to_pylist() == [b"k", None, b"p", b"k2"]
    assert rb.column("value").to_pylist() == [b"v", None, b"q", b""]
    assert rb.column("timestampType").to_pylist() == [0, 0, 0, 1]
    assert rb.column("timestamp").cast(pa.int64()).to_pylist() == [1_700_000_000_123_000, 1_700_000_000_124_000,
                                                                    1_700_000_000_125_000, 1_700_000_000_200_000]
    assert rb.column("headers").to_pylist() == [[{"key": "h", "value": b"x"}, {"key": "n", "value": None}], None,
                                                None, None]
    plain = to_record_batch("topic", 3, records[2:3], [(0, create_plain)], include_headers=False)
    assert plain.schema == arrow_schema(False) and plain.column("timestampType").to_pylist() == [0]
    assert to_record_batch("topic", 3, [], [], include_headers=False).num_rows == 0
    assert spark_ddl(True).endswith("headers array<struct<key: string, value: binary>>")


def test_importing_oncelog_spark_points_spark_workers_at_this_interpreter():
    code = "import os, oncelog.spark; print(os.environ['PYSPARK_PYTHON'])"
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_PYTHON"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == sys.executable
    env["PYSPARK_PYTHON"] = "/chosen/by/the/user"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "/chosen/by/the/user"
