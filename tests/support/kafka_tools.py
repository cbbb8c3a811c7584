"""Apache Kafka 4.4's command-line tools (kafka-topics, kafka-reassign-partitions, ...) as subprocesses.

The jars come from Maven Central through `kafka_tools/pom.xml` (org.apache.kafka:kafka-tools and what it needs),
resolved and cached exactly as the Kafka fixture's server jars (tests/support/kafka.py: `mvn
dependency:build-classpath` once, then the classpath from a file keyed by the pom's hash). Kafka's shell
scripts are thin wrappers around these main classes; running the classes directly needs no Kafka distribution:

    kafka-topics.sh                 TOPICS           org.apache.kafka.tools.TopicCommand
    kafka-reassign-partitions.sh    REASSIGN         org.apache.kafka.tools.reassign.ReassignPartitionsCommand
    kafka-leader-election.sh        LEADER_ELECTION  org.apache.kafka.tools.LeaderElectionCommand
    kafka-log-dirs.sh               LOG_DIRS         org.apache.kafka.tools.LogDirsCommand
    kafka-consumer-groups.sh        CONSUMER_GROUPS  org.apache.kafka.tools.consumer.group.ConsumerGroupCommand
    kafka-transactions.sh           TRANSACTIONS     org.apache.kafka.tools.TransactionsCommand

`kafka_tool(main_class, *args)` runs one to its end within a bounded timeout and returns its exit code and
output; tools that report an error print it and exit non-zero, so a test asserts on the ToolResult.
Without java/mvn (or Maven Central unreachable the first time) tools_runtime() raises KafkaUnavailable: a reason
to skip.
"""

from __future__ import annotations

import functools
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.support.kafka import KafkaUnavailable, java_executable, kafka_classpath

__all__ = ["CONSUMER_GROUPS", "LEADER_ELECTION", "LOG_DIRS", "REASSIGN", "TOPICS", "TRANSACTIONS",
           "KafkaUnavailable", "ToolResult", "kafka_tool", "tools_runtime"]

TOOLS_POM = Path(__file__).parent / "kafka_tools" / "pom.xml"
LOG4J2 = Path(__file__).parent / "kafka_tools" / "log4j2.properties"

TOPICS = "org.apache.kafka.tools.TopicCommand"
REASSIGN = "org.apache.kafka.tools.reassign.ReassignPartitionsCommand"
LEADER_ELECTION = "org.apache.kafka.tools.LeaderElectionCommand"
LOG_DIRS = "org.apache.kafka.tools.LogDirsCommand"
CONSUMER_GROUPS = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"
TRANSACTIONS = "org.apache.kafka.tools.TransactionsCommand"

# A tool is one short JVM (start ~2 s, then a few admin requests); on a loaded two-core machine the JVM alone can
# take ten times that. The bound is what a hung tool costs a test, not what a working one takes.
TOOL_TIMEOUT_S = 180.0
# Short-lived JVMs: a small heap, no JIT tiers past C1, serial GC; warnings and errors only, to stderr.
JVM_FLAGS = ("-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true")


@dataclass(frozen=True)
class ToolResult:
    """One tool run: its command line (main class first), exit code and output."""

    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def check(self) -> ToolResult:
        """Self if the tool exited 0, else AssertionError with its command line and both outputs."""
        if self.returncode != 0:
            raise AssertionError(f"{' '.join(self.args)} exited {self.returncode}\n--- stdout ---\n{self.stdout}"
                                 f"\n--- stderr ---\n{self.stderr}")
        return self

    def lines(self) -> list[str]:
        """Non-empty lines of stdout, stripped."""
        return [ln.strip() for ln in self.stdout.splitlines() if ln.strip()]


@functools.cache
def tools_runtime() -> tuple[str, str]:
    """(java, the tools' classpath) or KafkaUnavailable; resolved once per process."""
    return java_executable(), kafka_classpath(pom=TOOLS_POM, artifact="kafka-tools")


def kafka_tool(main_class: str, *args: str, timeout: float = TOOL_TIMEOUT_S, check: bool = False,
               stdin: str | None = None) -> ToolResult:
    """Run `main_class` of Kafka's tools with `args` to its end; KafkaUnavailable if Kafka cannot run here.

    The JVM runs in a session of its own and is killed if it outlives `timeout` (then AssertionError with what
    it printed so far). `check`: AssertionError unless it exits 0."""
    java, classpath = tools_runtime()
    argv = (java, *JVM_FLAGS, f"-Dlog4j2.configurationFile={LOG4J2}", "-cp", classpath, main_class, *args)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, input=stdin,
                              stdin=None if stdin is not None else subprocess.DEVNULL, start_new_session=True)
    except subprocess.TimeoutExpired as exc:   # subprocess.run killed it
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        raise AssertionError(f"{main_class} {' '.join(args)} did not finish in {timeout:.0f} s\n"
                             f"--- stdout ---\n{out}\n--- stderr ---\n{err}") from exc
    result = ToolResult((main_class, *args), proc.returncode, proc.stdout, proc.stderr)
    return result.check() if check else result


def describe_partitions(output: str) -> dict[tuple[str, int], dict[str, object]]:
    """kafka-topics --describe's partition lines, by (topic, partition): Leader (int, -1 for "none"), Replicas,
    Isr, Elr, LastKnownElr (lists of ints), any other field as text. Fields are tab-separated "Name: value"."""
    parsed: dict[tuple[str, int], dict[str, object]] = {}
    for line in output.splitlines():
        fields: dict[str, str] = {}
        for cell in line.strip().split("\t"):
            name, sep, value = cell.partition(":")
            if sep:
                fields[name.strip()] = value.strip()
        if "Partition" not in fields or "Topic" not in fields:
            continue
        entry: dict[str, object] = dict(fields)
        leader = fields.get("Leader", "none")
        entry["Leader"] = int(leader) if leader.lstrip("-").isdigit() else -1
        for name in ("Replicas", "Isr", "Elr", "LastKnownElr"):
            if name in fields:
                entry[name] = [int(x) for x in fields[name].split(",") if x.strip().lstrip("-").isdigit()]
        parsed[(fields["Topic"], int(fields["Partition"]))] = entry
    return parsed
