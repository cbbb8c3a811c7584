"""Apache Kafka 4.4's own command-line tools against oncelog: three `oncelog serve` processes on ZooKeeper, and the
single node.

kafka-topics (create with replication factor 3, --describe parsed and held against every broker's Metadata, alter
--partitions, delete), kafka-reassign-partitions (--generate / --execute / --verify moving replicas to other
brokers with the data intact; the same under an idempotent acks=all producer, every acknowledged record read back
once and in order; a plan whose log_dirs name each broker's directory; --throttle refused before anything
starts), kafka-leader-election (preferred, after a controlled shutdown moved leaders away), kafka-log-dirs (every replica, followers included, with the leader's
size), kafka-consumer-groups (--describe, --state, --members) and kafka-transactions (describe-producers on a
follower, find-hanging per broker). The tools run as Kafka ships them (main classes of org.apache.kafka:kafka-tools
from Maven Central, tests/support/kafka_tools.py); without java/mvn they are skipped with the reason.

The brokers are shared by the module (each test uses topics of its own, and any broker a test stopped is started
again before the next). Each test takes seconds (a tool is one short JVM), so all of them run in `make test`.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as CkPartition
from kafka.protocol.admin import AlterReplicaLogDirsRequest, IncrementalAlterConfigsRequest

from oncelog.broker.handlers.controller_requests import DEFAULT_TIMEOUT_MS
from oncelog.coordinator.partitioning import partition_for
from oncelog.embedded import ClusterProcess
from tests.cluster.cluster_processes import SETTINGS, START_S, converge_s, partitions, request, wait_for
from tests.support.kafka_tools import (
    CONSUMER_GROUPS,
    LEADER_ELECTION,
    LOG_DIRS,
    REASSIGN,
    TOPICS,
    TRANSACTIONS,
    KafkaUnavailable,
    ToolResult,
    describe_partitions,
    kafka_tool,
    tools_runtime,
)

UNKNOWN_TOPIC = 3


@pytest.fixture(scope="module")
def tools() -> None:
    try:
        tools_runtime()
    except KafkaUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def _module_cluster(coordination, tmp_path_factory) -> Iterator[ClusterProcess]:
    from kazoo.client import KazooClient

    chroot = f"/tools-{uuid.uuid4().hex[:12]}"
    zk = KazooClient(hosts=coordination.servers)
    zk.start(timeout=30)
    try:
        zk.ensure_path(chroot)
    finally:
        zk.stop()
        zk.close()
    c = ClusterProcess(tmp_path_factory.mktemp("tools-cluster"), 3, SETTINGS,
                       connect=coordination.connect_string(chroot))
    c.start(START_S)
    yield c
    c.kill_all()  # the chroot is this module's alone: the sessions left behind expire unseen


@pytest.fixture
def cluster(_module_cluster, tools) -> ClusterProcess:
    """The module's three brokers, every one running (a broker an earlier test stopped is started again)."""
    c = _module_cluster
    for node in sorted(c.brokers):
        if not c.brokers[node].alive():
            c.start_broker(node, timeout=converge_s())
    c.wait_registered(set(c.brokers), timeout=converge_s())
    return c


def tool(c: ClusterProcess, main_class: str, *args: str, check: bool = True) -> ToolResult:
    return kafka_tool(main_class, "--bootstrap-server", c.bootstrap, *args, check=check)


def topic_tool(c: ClusterProcess, *args: str, check: bool = True) -> ToolResult:
    return tool(c, TOPICS, *args, check=check)


def create(c: ClusterProcess, topic: str, *args: str) -> None:
    assert f"Created topic {topic}." in topic_tool(c, "--create", "--topic", topic, *args).stdout
    wait_for(lambda: all(partitions(c, topic, via=n) for n in c.brokers), f"every broker to show {topic}", 30)


def as_described(c: ClusterProcess, topic: str, via: int | None = None) -> dict[int, tuple[int, list[int], list[int]]]:
    """{partition: (leader, replicas, isr)} from a broker's Metadata, in the order Metadata gives them."""
    return {p: (s.leader_id, list(s.replica_nodes), list(s.isr_nodes)) for p, s in partitions(c, topic, via).items()}


def tool_view(output: str, topic: str) -> dict[int, tuple[int, list[int], list[int]]]:
    return {p: (e["Leader"], e["Replicas"], e["Isr"]) for (t, p), e in describe_partitions(output).items()
            if t == topic}


def produce_values(c: ClusterProcess, topic: str, values: dict[int, list[bytes]]) -> None:
    producer = Producer({"bootstrap.servers": c.bootstrap, "acks": "all", "enable.idempotence": True})
    failed: list[str] = []
    for p, vals in values.items():
        for v in vals:
            producer.produce(topic, value=v, partition=p,
                             on_delivery=lambda err, msg: err is not None and failed.append(str(err)))
    assert producer.flush(converge_s()) == 0 and failed == []


def read_all(c: ClusterProcess, topic: str, parts: list[int]) -> dict[int, list[bytes]]:
    """Every record of `parts` from the log start to the end offsets of the moment (read_committed not needed)."""
    consumer = Consumer({"bootstrap.servers": c.bootstrap, "group.id": f"reader-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        ends = {p: consumer.get_watermark_offsets(CkPartition(topic, p), timeout=30)[1] for p in parts}
        consumer.assign([CkPartition(topic, p, 0) for p in parts])
        got: dict[int, list[bytes]] = {p: [] for p in parts}
        positions = {p: 0 for p in parts}
        deadline = time.monotonic() + converge_s()
        while any(positions[p] < ends[p] for p in parts):
            assert time.monotonic() < deadline, f"read {positions} of {ends}"
            for m in consumer.consume(500, 0.5):
                assert m.error() is None, m.error()
                assert m.offset() == positions[m.partition()], "a gap or a repeat in the log"
                got[m.partition()].append(m.value())
                positions[m.partition()] = m.offset() + 1
        return got
    finally:
        consumer.close()


# -- kafka-topics ---------------------------------------------------------------------------------------------


def test_kafka_topics_create_describe_alter_delete(cluster):
    c = cluster
    topic = "tools-topics"
    create(c, topic, "--partitions", "6", "--replication-factor", "3")
    out = topic_tool(c, "--describe", "--topic", topic).stdout
    header = next(ln for ln in out.splitlines() if ln.startswith(f"Topic: {topic}\t"))
    assert "PartitionCount: 6\tReplicationFactor: 3" in header
    described = tool_view(out, topic)
    assert sorted(described) == list(range(6))
    for leader, replicas, isr in described.values():
        assert sorted(replicas) == [1, 2, 3] and leader == replicas[0] and sorted(isr) == [1, 2, 3]
    assert sorted(r[0] for _, r, _ in described.values()) == [1, 1, 2, 2, 3, 3]  # leaders spread
    for node in c.brokers:  # what the tool printed is what every broker says
        assert as_described(c, topic, via=node) == described
    assert topic in topic_tool(c, "--list").lines()
    topic_id = re.search(r"TopicId: (\S+)", header).group(1)
    by_id = topic_tool(c, "--describe", "--topic-id", topic_id).stdout
    assert f"Topic: {topic}\tTopicId: {topic_id}\t" in by_id and tool_view(by_id, topic) == described
    again = topic_tool(c, "--create", "--topic", topic, "--partitions", "1", check=False)
    assert not again.ok and "already exists" in again.stdout + again.stderr
    topic_tool(c, "--create", "--if-not-exists", "--topic", topic, "--partitions", "1")

    topic_tool(c, "--alter", "--topic", topic, "--partitions", "8")
    wait_for(lambda: all(len(partitions(c, topic, via=n)) == 8 for n in c.brokers), "8 partitions everywhere", 30)
    grown = tool_view(topic_tool(c, "--describe", "--topic", topic).stdout, topic)
    assert {p: grown[p] for p in range(6)} == described
    assert all(sorted(grown[p][1]) == [1, 2, 3] and grown[p][0] == grown[p][1][0] for p in (6, 7))
    assert as_described(c, topic) == grown
    shrink = topic_tool(c, "--alter", "--topic", topic, "--partitions", "4", check=False)
    assert not shrink.ok and "InvalidPartitionsException" in shrink.stderr
    # Nothing under-replicated, unavailable or below its min ISR with every broker up.
    for flag in ("--under-replicated-partitions", "--unavailable-partitions", "--under-min-isr-partitions"):
        assert tool_view(topic_tool(c, "--describe", "--topic", topic, flag).stdout, topic) == {}

    topic_tool(c, "--delete", "--topic", topic)
    for node in c.brokers:
        wait_for(lambda n=node: c.metadata(n, [topic]).topics[0].error_code == UNKNOWN_TOPIC,
                 f"broker {node} to forget {topic}", 30)
    assert topic not in topic_tool(c, "--list").lines()

    def copies() -> list[str]:
        return [str(path) for b in c.brokers.values() for path in b.data_dir.glob(f"{topic}-*")]

    try:
        wait_for(lambda: copies() == [], "every copy deleted", 30)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; copies left: {copies()}") from None


def test_kafka_topics_and_reassign_partitions_on_the_single_node(module_broker, tools, tmp_path):
    bs = module_broker.bootstrap
    topic = "tools-single"
    run = kafka_tool(TOPICS, "--bootstrap-server", bs, "--create", "--topic", topic, "--partitions", "3",
                     "--replication-factor", "1", check=True)
    assert f"Created topic {topic}." in run.stdout
    kafka_tool(TOPICS, "--bootstrap-server", bs, "--alter", "--topic", topic, "--partitions", "4", check=True)
    out = kafka_tool(TOPICS, "--bootstrap-server", bs, "--describe", "--topic", topic, check=True).stdout
    assert "PartitionCount: 4\tReplicationFactor: 1" in out
    assert tool_view(out, topic) == {p: (0, [0], [0]) for p in range(4)}
    topic_id = re.search(r"TopicId: (\S+)", out).group(1)
    by_id = kafka_tool(TOPICS, "--bootstrap-server", bs, "--describe", "--topic-id", topic_id, check=True).stdout
    assert tool_view(by_id, topic) == tool_view(out, topic)
    too_wide = kafka_tool(TOPICS, "--bootstrap-server", bs, "--create", "--topic", f"{topic}-rf3",
                          "--partitions", "1", "--replication-factor", "3")
    assert not too_wide.ok and "replication factor" in (too_wide.stdout + too_wide.stderr).lower()
    # A reassignment onto the one broker completes at once, and --verify clears the (absent) throttles.
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [{"topic": topic, "partition": 1, "replicas": [0]}]}))
    executed = kafka_tool(REASSIGN, "--bootstrap-server", bs, "--execute", "--reassignment-json-file", str(plan),
                          check=True)
    assert f"Successfully started partition reassignment for {topic}-1" in executed.stdout
    verified = kafka_tool(REASSIGN, "--bootstrap-server", bs, "--verify", "--reassignment-json-file", str(plan),
                          check=True)
    assert f"Reassignment of partition {topic}-1 is completed." in verified.stdout
    assert "Clearing broker-level throttles on broker 0" in verified.stdout
    kafka_tool(TOPICS, "--bootstrap-server", bs, "--delete", "--topic", topic, check=True)
    assert topic not in kafka_tool(TOPICS, "--bootstrap-server", bs, "--list", check=True).lines()


# -- kafka-reassign-partitions --------------------------------------------------------------------------------


def reassignment_plan(output: str) -> dict:
    """The JSON that follows 'Proposed partition reassignment configuration' in --generate's output."""
    lines = output.splitlines()
    start = lines.index("Proposed partition reassignment configuration")
    return json.loads(lines[start + 1])


def verify_until_complete(c: ClusterProcess, plan_file: Path, parts: list[str]) -> str:
    """--verify until it reports every one of `parts` (topic-partition names) completed; its last output."""
    def complete() -> str | None:
        out = tool(c, REASSIGN, "--verify", "--reassignment-json-file", str(plan_file)).stdout
        done = all(f"Reassignment of partition {p} is completed." in out for p in parts)
        return out if done else None

    return wait_for(complete, "the reassignment to complete", converge_s())


def test_kafka_reassign_partitions_generate_execute_verify(cluster, tmp_path):
    c = cluster
    topic = "tools-moved"
    create(c, topic, "--replica-assignment", "1:2,2:1,1:2")
    values = {p: [b"%d-%d" % (p, i) for i in range(300)] for p in range(3)}
    produce_values(c, topic, values)
    leaders = {p: leader for p, (leader, _, _) in as_described(c, topic).items()}
    (tmp_path / "topics.json").write_text(json.dumps({"version": 1, "topics": [{"topic": topic}]}))
    generated = tool(c, REASSIGN, "--generate", "--topics-to-move-json-file", str(tmp_path / "topics.json"),
                     "--broker-list", "2,3").stdout
    proposed = reassignment_plan(generated)
    targets = {e["partition"]: e["replicas"] for e in proposed["partitions"]}
    assert sorted(targets) == [0, 1, 2] and all(sorted(r) == [2, 3] for r in targets.values())
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(proposed))
    executed = tool(c, REASSIGN, "--execute", "--reassignment-json-file", str(plan)).stdout
    assert "Successfully started partition reassignment" in executed
    final = verify_until_complete(c, plan, [f"{topic}-{p}" for p in range(3)])
    assert "Clearing broker-level throttles" in final and "Clearing topic-level throttles" in final
    # Every broker now names the proposed replicas, all in sync. As in Kafka, a leader that stays a replica keeps
    # its leadership; one that was moved off hands it to the first new replica. Broker 1 holds nothing.
    expected = {p: (leaders[p] if leaders[p] in t else t[0], t, sorted(t)) for p, t in targets.items()}
    for node in c.brokers:
        wait_for(lambda n=node: {p: (r[0], r[1], sorted(r[2])) for p, r in as_described(c, topic, via=n).items()}
                 == expected, f"broker {node} to show the new replicas", 30)
    described = tool_view(tool(c, TOPICS, "--describe", "--topic", topic).stdout, topic)
    assert {p: (leader, replicas, sorted(isr)) for p, (leader, replicas, isr) in described.items()} == expected
    wait_for(lambda: not any(c.brokers[1].data_dir.glob(f"{topic}-*")), "broker 1's copies deleted", 30)
    assert tool(c, REASSIGN, "--list").stdout.strip() == "No partition reassignments found."
    assert read_all(c, topic, [0, 1, 2]) == values  # the data moved intact


def test_kafka_reassign_partitions_throttle_is_refused_before_anything_moves(cluster, tmp_path):
    # oncelog throttles no replication; a throttled reassignment fails at the throttle, before it starts.
    c = cluster
    topic = "tools-throttled"
    create(c, topic, "--replica-assignment", "1:2")
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [{"topic": topic, "partition": 0, "replicas": [3, 2]}]}))
    run = tool(c, REASSIGN, "--execute", "--reassignment-json-file", str(plan), "--throttle", "1000000",
               check=False)
    assert not run.ok and "oncelog does not throttle replication" in run.stdout + run.stderr
    assert "Successfully started" not in run.stdout
    assert as_described(c, topic)[0][1] == [1, 2]
    assert tool(c, REASSIGN, "--list").stdout.strip() == "No partition reassignments found."


def test_kafka_reassign_partitions_under_an_idempotent_acks_all_producer(cluster, tmp_path):
    """Replicas (and leaderships) move while an idempotent producer writes with acks=all: the producer sees no
    error, and every acknowledged record is in the log once, in the order it was sent."""
    c = cluster
    topic = "tools-loaded"
    create(c, topic, "--replica-assignment", "1:2,2:3,3:1", "--config", "min.insync.replicas=2")
    acked: dict[int, list[bytes]] = {0: [], 1: [], 2: []}
    errors: list[str] = []
    stop = threading.Event()
    counts = {"sent": 0}

    def write() -> None:
        producer = Producer({"bootstrap.servers": c.bootstrap, "enable.idempotence": True, "acks": "all",
                             "linger.ms": 5})

        def report(err, msg) -> None:
            (errors.append(str(err)) if err is not None else acked[msg.partition()].append(msg.value()))

        i = 0
        while not stop.is_set():
            try:
                producer.produce(topic, value=b"%08d" % i + b"." * 200, partition=i % 3, on_delivery=report)
            except BufferError:
                producer.poll(0.05)
                continue
            producer.poll(0)
            i += 1
        counts["sent"] = i
        assert producer.flush(converge_s()) == 0

    writer = threading.Thread(target=write, name="loaded-writer")
    writer.start()
    try:
        wait_for(lambda: sum(map(len, acked.values())) > 3000, "writes to flow", 60)
        # Every partition moves: each loses its first replica (its leader) and gains the broker it lacked.
        targets = {0: [3, 2], 1: [1, 3], 2: [2, 1]}
        plan = tmp_path / "plan.json"
        plan.write_text(json.dumps({"version": 1, "partitions": [
            {"topic": topic, "partition": p, "replicas": r} for p, r in targets.items()]}))
        assert "Successfully started" in tool(c, REASSIGN, "--execute", "--reassignment-json-file",
                                              str(plan)).stdout
        verify_until_complete(c, plan, [f"{topic}-{p}" for p in targets])
        wait_for(lambda: {p: (r[0], r[1]) for p, r in as_described(c, topic).items()}
                 == {p: (t[0], t) for p, t in targets.items()}, "the new leaders", 30)
        count = sum(map(len, acked.values()))
        wait_for(lambda: sum(map(len, acked.values())) > count + 1000, "writes to go on after the move", 60)
    finally:
        stop.set()
        writer.join(converge_s() + 30)
    assert not writer.is_alive()
    assert errors == []
    total = sum(map(len, acked.values()))
    assert total == counts["sent"]
    assert read_all(c, topic, [0, 1, 2]) == acked  # once each, in the order sent, nothing else


# -- kafka-leader-election ------------------------------------------------------------------------------------


def elected(output: str, election: str = "PREFERRED") -> set[str]:
    match = re.search(rf"Successfully completed leader election \({election}\) for partitions (.*)", output)
    return set(match.group(1).split(", ")) if match else set()


def test_kafka_leader_election_preferred_after_leaders_moved_away(cluster):
    c = cluster
    topic, lonely = "tools-elected", "tools-elected-lonely"
    create(c, topic, "--partitions", "6", "--replication-factor", "3")
    before = as_described(c, topic)
    controller = c.controller()
    victim = next(n for n in (1, 2, 3) if n != controller)
    create(c, lonely, "--replica-assignment", str(victim))
    preferred_here = sorted(p for p, (_, replicas, _) in before.items() if replicas[0] == victim)
    assert preferred_here
    assert c.stop_broker(victim) == 0  # a controlled shutdown moves its leaderships away
    # While it is down: its partitions under-replicated, its lone replica unavailable ("Leader: none"), and a
    # preferred election it would win refused, as Kafka refuses it.
    wait_for(lambda: all(victim not in isr for _, _, isr in as_described(c, topic).values()), "the ISRs to shrink")
    under = tool_view(topic_tool(c, "--describe", "--topic", topic, "--under-replicated-partitions").stdout, topic)
    assert sorted(under) == list(range(6)) and all(victim not in isr for _, _, isr in under.values())
    unavailable = topic_tool(c, "--describe", "--topic", lonely, "--unavailable-partitions").stdout
    assert tool_view(unavailable, lonely) == {0: (-1, [victim], [victim])} and "Leader: none" in unavailable
    refused = tool(c, LEADER_ELECTION, "--election-type", "PREFERRED", "--topic", topic, "--partition",
                   str(preferred_here[0]), check=False)
    assert not refused.ok and "PreferredLeaderNotAvailableException" in refused.stdout + refused.stderr
    c.start_broker(victim, timeout=converge_s())

    def every_replica_in_sync() -> bool:  # of every topic: an election of all partitions needs them in the ISR
        md = c.metadata(None, None)
        return all(sorted(p.isr_nodes) == sorted(p.replica_nodes) for t in md.topics for p in t.partitions)

    wait_for(every_replica_in_sync, f"broker {victim} back in every ISR")
    moved = as_described(c, topic)
    assert sorted(p for p, (leader, replicas, _) in moved.items() if leader != replicas[0]) == preferred_here
    epochs = {p: s.leader_epoch for p, s in partitions(c, topic).items()}

    run = tool(c, LEADER_ELECTION, "--election-type", "PREFERRED", "--all-topic-partitions")
    assert {name for name in elected(run.stdout) if name.startswith(f"{topic}-")} == {
        f"{topic}-{p}" for p in preferred_here}
    for node in c.brokers:
        wait_for(lambda n=node: all(leader == replicas[0] for leader, replicas, _ in
                                    as_described(c, topic, via=n).values()), f"broker {node} to show them", 30)
    now = partitions(c, topic)
    assert {p: s.leader_epoch for p, s in now.items()} == {
        p: e + (1 if p in preferred_here else 0) for p, e in epochs.items()}
    again = tool(c, LEADER_ELECTION, "--election-type", "PREFERRED", "--topic", topic, "--partition",
                 str(preferred_here[0]))
    assert f"Valid replica already elected for partitions {topic}-{preferred_here[0]}" in again.stdout
    # Unclean elections only concern partitions without a leader: there are none.
    unclean = tool(c, LEADER_ELECTION, "--election-type", "UNCLEAN", "--all-topic-partitions")
    assert elected(unclean.stdout, "UNCLEAN") == set()


def test_kafka_reassign_partitions_with_log_dirs(cluster, tmp_path):
    """A plan whose "log_dirs" name directories, not only "any": the tool sends AlterReplicaLogDirs to each broker
    named with a directory. oncelog's brokers have one log directory each (the one DescribeLogDirs names), so the
    move is to where the replica already is (NONE); a replica the reassignment is still bringing to a broker is
    REPLICA_NOT_AVAILABLE there, which the tool retries until it is; --verify reports each replica's move done."""
    c = cluster
    topic = "tools-log-dirs"
    create(c, topic, "--replica-assignment", "1:2,2:1")
    values = {p: [b"%d-%d" % (p, i) for i in range(50)] for p in range(2)}
    produce_values(c, topic, values)
    dirs = {n: str(b.data_dir.resolve()) for n, b in c.brokers.items()}
    out = tool(c, LOG_DIRS, "--describe", "--topic-list", topic).stdout
    doc = json.loads(next(ln for ln in out.splitlines() if ln.startswith("{")))
    assert {b["broker"]: [d["logDir"] for d in b["logDirs"]] for b in doc["brokers"]} == {n: [dirs[n]] for n in dirs}

    # The answers at the wire, in cluster mode.
    def alter(node: int, path: str, name: str = topic, part: int = 1) -> int:
        req = AlterReplicaLogDirsRequest[2]
        d = req.AlterReplicaLogDir
        resp = request(c, node, req(dirs=[d(path=path, topics=[d.AlterReplicaLogDirTopic(name=name, partitions=[part])])]), 2)
        ((result,),) = [r.partitions for r in resp.results]
        return result.error_code

    assert alter(2, dirs[2]) == 0
    assert alter(2, dirs[3]) == 57  # LOG_DIR_NOT_FOUND: not broker 2's directory
    assert alter(3, dirs[3]) == 9  # REPLICA_NOT_AVAILABLE: the partition has no replica on broker 3 (yet)
    assert alter(3, dirs[3], f"{topic}-none", 0) == UNKNOWN_TOPIC

    # Partition 0 stays where it is with broker 1's directory named; partition 1 moves from 2,1 to 2,3 and names
    # broker 3's directory, where the replica appears only once the reassignment has created it.
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": topic, "partition": 0, "replicas": [1, 2], "log_dirs": [dirs[1], "any"]},
        {"topic": topic, "partition": 1, "replicas": [2, 3], "log_dirs": ["any", dirs[3]]},
    ]}))
    executed = tool(c, REASSIGN, "--execute", "--reassignment-json-file", str(plan)).stdout
    assert f"Successfully started partition reassignments for {topic}-0,{topic}-1" in executed
    assert f"Successfully started moving log directory to {dirs[1]} for replica {topic}-0 with broker 1" in executed
    assert f"Successfully started moving log directory to {dirs[3]} for replica {topic}-1 with broker 3" in executed
    final = verify_until_complete(c, plan, [f"{topic}-0", f"{topic}-1"])
    assert f"Reassignment of replica {topic}-0-1 completed successfully." in final
    assert f"Reassignment of replica {topic}-1-3 completed successfully." in final
    assert {p: r for p, (_, r, _) in as_described(c, topic).items()} == {0: [1, 2], 1: [2, 3]}
    assert read_all(c, topic, [0, 1]) == values

    # A directory that is not the broker's: the tool stops with Kafka's error (the partitions stay put).
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": topic, "partition": 0, "replicas": [1, 2], "log_dirs": [dirs[2], "any"]}]}))
    refused = tool(c, REASSIGN, "--execute", "--reassignment-json-file", str(wrong), check=False)
    assert not refused.ok and "LogDirNotFoundException" in refused.stdout + refused.stderr
    assert {p: r for p, (_, r, _) in as_described(c, topic).items()} == {0: [1, 2], 1: [2, 3]}
    wait_for(lambda: tool(c, REASSIGN, "--list").stdout.strip() == "No partition reassignments found.",
             "no reassignment left", 30)


# -- kafka-log-dirs -------------------------------------------------------------------------------------------


def log_dirs(c: ClusterProcess, *topics: str) -> dict[int, dict[str, dict]]:
    """{broker: {topic-partition: entry}} from kafka-log-dirs --describe (its JSON line)."""
    out = tool(c, LOG_DIRS, "--describe", "--topic-list", ",".join(topics)).stdout
    doc = json.loads(next(ln for ln in out.splitlines() if ln.startswith("{")))
    return {b["broker"]: {e["partition"]: e for d in b["logDirs"] for e in d["partitions"]} for b in doc["brokers"]}


def test_kafka_log_dirs_lists_every_replica(cluster):
    c = cluster
    spread, placed = "tools-dirs-spread", "tools-dirs-placed"
    create(c, spread, "--partitions", "3", "--replication-factor", "3")
    create(c, placed, "--replica-assignment", "2,3")
    produce_values(c, spread, {p: [b"x" * 100] * (10 * (p + 1)) for p in range(3)})
    expected: dict[int, set[str]] = {1: set(), 2: set(), 3: set()}
    for topic in (spread, placed):
        for p, (_, replicas, _) in as_described(c, topic).items():
            for r in replicas:
                expected[r].add(f"{topic}-{p}")

    def listed() -> dict[int, dict[str, dict]] | None:
        dirs = log_dirs(c, spread, placed)
        if {b: set(parts) for b, parts in dirs.items()} != expected:
            return None
        sizes = [{dirs[b][f"{spread}-{p}"]["size"] for b in (1, 2, 3)} for p in range(3)]
        return dirs if all(len(s) == 1 and s != {0} for s in sizes) else None

    # Every replica of both topics on the broker that holds it, followers as well as leaders, each copy of a
    # partition as big as the others once the followers have caught up; no broker lists what it does not hold.
    dirs = wait_for(listed, "every replica listed with the leader's size", 60)
    assert all(not e["isFuture"] and e["offsetLag"] == 0 for parts in dirs.values() for e in parts.values())
    sizes = [dirs[1][f"{spread}-{p}"]["size"] for p in range(3)]
    assert sizes[0] < sizes[1] < sizes[2]


# -- kafka-consumer-groups ------------------------------------------------------------------------------------


def table(output: str) -> list[dict[str, str]]:
    """The rows of a kafka-consumer-groups table. Columns are left-aligned at the header's positions (header names
    are apart by two spaces or more; "COORDINATOR (ID)" is one name), so each value is cut at those positions."""
    lines = [ln.rstrip() for ln in output.splitlines() if ln.strip()]
    start = next(i for i, ln in enumerate(lines) if ln.startswith("GROUP "))
    columns = [(m.start(), m.group()) for m in re.finditer(r"\S+(?: \S+)*", lines[start])]
    rows = []
    for ln in lines[start + 1:]:
        if ln.startswith(("Consumer group", "GROUP ")):
            break
        bounds = [at for at, _ in columns[1:]] + [len(ln)]
        rows.append({name: ln[at:end].strip() for (at, name), end in zip(columns, bounds, strict=True)})
    return rows


def test_kafka_consumer_groups_describe(cluster):
    c = cluster
    topic, group = "tools-grouped", f"tools-group-{uuid.uuid4().hex[:6]}"
    create(c, topic, "--partitions", "2", "--replication-factor", "3")
    produce_values(c, topic, {p: [b"%d" % i for i in range(10)] for p in range(2)})
    consumer = Consumer({"bootstrap.servers": c.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, "client.id": "tools-reader"})
    try:
        consumer.subscribe([topic])
        seen = 0
        deadline = time.monotonic() + converge_s()
        while seen < 20 and time.monotonic() < deadline:
            seen += sum(1 for m in consumer.consume(20, 0.5) if m.error() is None)
        assert seen == 20
        consumer.commit(asynchronous=False)
        produce_values(c, topic, {0: [b"late"] * 5})
        rows = table(tool(c, CONSUMER_GROUPS, "--describe", "--group", group).stdout)
        assert [(r["TOPIC"], r["PARTITION"], r["CURRENT-OFFSET"], r["LOG-END-OFFSET"], r["LAG"]) for r in rows] == [
            (topic, "0", "10", "15", "5"), (topic, "1", "10", "10", "0")]
        assert all(r["CLIENT-ID"] == "tools-reader" and r["CONSUMER-ID"].startswith("tools-reader-") for r in rows)
        (state,) = table(tool(c, CONSUMER_GROUPS, "--describe", "--group", group, "--state").stdout)
        assert (state["STATE"], state["#MEMBERS"], state["ASSIGNMENT-STRATEGY"]) == ("Stable", "1", "range")
        # The coordinator it names leads the group's partition of __consumer_offsets (Java's hash of the id).
        coordinator = int(re.search(r"\((\d+)\)", tool(c, CONSUMER_GROUPS, "--describe", "--group", group,
                                                        "--state").stdout).group(1))
        offsets_partition = partition_for(group, len(partitions(c, "__consumer_offsets")))
        assert partitions(c, "__consumer_offsets")[offsets_partition].leader_id == coordinator
        (member,) = table(tool(c, CONSUMER_GROUPS, "--describe", "--group", group, "--members").stdout)
        assert member["#PARTITIONS"] == "2" and member["CLIENT-ID"] == "tools-reader"
        assert group in tool(c, CONSUMER_GROUPS, "--list").lines()
    finally:
        consumer.close()
    after = tool(c, CONSUMER_GROUPS, "--describe", "--group", group)
    assert f"Consumer group '{group}' has no active members." in after.stdout + after.stderr
    assert [(r["PARTITION"], r["CURRENT-OFFSET"], r["CONSUMER-ID"]) for r in table(after.stdout)] == [
        ("0", "10", "-"), ("1", "10", "-")]


# -- kafka-transactions (KIP-664 on replicas) -----------------------------------------------------------------


def test_kafka_transactions_describe_producers_on_a_follower_and_find_hanging(cluster):
    c = cluster
    topic = "tools-producers"
    create(c, topic, "--partitions", "1", "--replication-factor", "3")
    produce_values(c, topic, {0: [b"a", b"b", b"c"]})
    leader, replicas, _ = as_described(c, topic)[0]
    follower = next(r for r in replicas if r != leader)

    def producers(*broker: str) -> list[dict[str, str]]:
        out = tool(c, TRANSACTIONS, "describe-producers", "--topic", topic, "--partition", "0", *broker).stdout
        lines = [ln.split("\t") for ln in out.splitlines() if ln.strip()]
        return [dict(zip([h.strip() for h in lines[0]], [v.strip() for v in row], strict=False))
                for row in lines[1:]]

    on_leader = producers()
    assert len(on_leader) == 1 and on_leader[0]["LastSequence"] == "2"
    # Kafka answers DescribeProducers from any replica: the follower built the same producer state.
    wait_for(lambda: producers("--broker-id", str(follower)) == on_leader, "the follower's producer state", 30)
    # find-hanging asks each broker about every partition it holds, followers included.
    for node in c.brokers:
        hanging = tool(c, TRANSACTIONS, "find-hanging", "--broker-id", str(node)).lines()
        assert hanging[0].startswith("Topic\tPartition\tProducerId") and hanging[1:] == []


# -- a bug the reassignment tool found ------------------------------------------------------------------------


def test_a_config_write_that_changes_nothing_is_answered_at_once_by_a_broker_that_is_not_the_controller(cluster):
    """`kafka-reassign-partitions --verify` deletes throttle configs nobody set; through a broker that is not the
    controller the answer waited for a change of the image that never came (30 s per topic)."""
    c = cluster
    topic = "tools-noop-config"
    create(c, topic, "--partitions", "1", "--replication-factor", "3")
    via = next(n for n in sorted(c.brokers) if n != c.controller())
    alter = IncrementalAlterConfigsRequest[1]
    # Whether the answer waited depended on a race (the watch before or after the controller's answer), so the
    # request is made a few times; tests/unit/cluster/test_metadata_image.py holds the rule itself.
    for name in ("retention.ms", "leader.replication.throttled.replicas") * 4:
        started = time.monotonic()
        resp = request(c, via, alter(resources=[alter.AlterConfigsResource(
            resource_type=2, resource_name=topic, configs=[
                alter.AlterConfigsResource.AlterableConfig(name=name, config_operation=1, value=None)])],
            validate_only=False), 1)
        took = time.monotonic() - started
        assert resp.responses[0].error_code == 0, resp
        assert took < DEFAULT_TIMEOUT_MS / 1000 / 2, f"deleting unset {name} took {took:.1f} s"
