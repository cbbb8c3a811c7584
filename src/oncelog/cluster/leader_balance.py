"""The automatic preferred-leader rebalance (`auto.leader.rebalance.enable`), decided as a pure function of the
partitions, the live brokers and `leader.imbalance.per.broker.percentage`.

Without it a broker that stops hands its leaderships to other replicas and gets none back when it returns: after
a rolling restart every leader sits on the brokers that stopped last, and they carry all the produce and fetch
traffic. The rule is Kafka's ZooKeeper-era controller's (KafkaController.checkAndTriggerAutoLeaderRebalance), so an
operator's expectations carry over:

- Every partition is grouped under its preferred replica, the first replica of its assignment (during a
  reassignment the first of the target, as Kafka's replicas list is the target followed by the replicas leaving).
- A broker's imbalance is the share of its group led by another broker or by none; a partition without a state
  yet counts in the group but not as led elsewhere (Kafka: `leadershipInfo.exists(_.leader != broker)`).
- Only a broker whose share is strictly above the percentage gets its leaderships back, and then all of them at
  once, each where the preferred replica can lead now: alive, not in controlled shutdown, in the ISR. The same
  condition as ElectLeaders PREFERRED (`elections.preferred_election`), which the controller applies again inside
  its compare-and-set.
- Partitions being reassigned are not special: Kafka before 3.4 skipped the whole round while any reassignment was
  in progress, and KAFKA-10149 removed that because one long reassignment starved every preferred election; the
  target's first replica is a safe leader once it is in the ISR. A broker shutting down is never chosen (its
  partitions are neither elected nor waited for), but other brokers' rounds go on.

KRaft's QuorumController decides differently: it ignores the percentage and elects the preferred replica of every
partition that has one available (ReplicationControlManager.maybeBalancePartitionLeaders, at most 1,000 elections
a round). The percentage is kept because it is the documented meaning of the key oncelog accepts.

The share is compared in integers (100 × led elsewhere > percentage × preferred): exact, and the same answer as
Kafka's `elsewhere.toDouble / preferred > percentage.toDouble / 100` for any real partition count (1 of 10 at 10%
is at the threshold, not above it, and stays).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from oncelog.errors import ErrorCode

from .elections import preferred_election
from .metadata_image import PartitionAssignment, PartitionState

TopicPartition = tuple[str, int]


@dataclass(frozen=True)
class BrokerImbalance:
    """One preferred replica's group: how many partitions prefer it and which of them are led elsewhere."""

    broker: int
    preferred: int = 0
    elsewhere: tuple[TopicPartition, ...] = ()

    @property
    def percentage(self) -> float:
        """For logs and docs only; decisions use `above`."""
        return 100.0 * len(self.elsewhere) / self.preferred if self.preferred else 0.0

    def above(self, percentage: int) -> bool:
        return 100 * len(self.elsewhere) > percentage * self.preferred


@dataclass(frozen=True)
class RebalancePlan:
    """What one check decided.

    `elect`: partitions whose preferred replica should lead now. `waiting`: partitions of brokers above the
    threshold whose preferred replica is alive and not shutting down but not in the ISR yet (a returning broker
    still catching up): a later check can elect them, which is what the controller's early re-check after a
    registration waits for. `brokers`: every group, for the log line."""

    elect: tuple[TopicPartition, ...] = ()
    waiting: tuple[TopicPartition, ...] = ()
    brokers: dict[int, BrokerImbalance] = field(default_factory=dict)


def imbalance(
    partitions: Iterable[tuple[TopicPartition, PartitionAssignment, PartitionState | None]],
) -> dict[int, BrokerImbalance]:
    """Each preferred replica's group (only brokers that are first in some assignment appear)."""
    preferred: dict[int, int] = {}
    elsewhere: dict[int, list[TopicPartition]] = {}
    for key, a, s in partitions:
        if not a.replicas:
            continue
        broker = a.replicas[0]
        preferred[broker] = preferred.get(broker, 0) + 1
        if s is not None and s.leader != broker:
            elsewhere.setdefault(broker, []).append(key)
    return {b: BrokerImbalance(b, n, tuple(elsewhere.get(b, ()))) for b, n in sorted(preferred.items())}


def plan_rebalance(
    partitions: Iterable[tuple[TopicPartition, PartitionAssignment, PartitionState | None]],
    live: Collection[int],
    shutting_down: Collection[int],
    percentage: int,
) -> RebalancePlan:
    """The elections one check makes (see the module docstring for the rule)."""
    parts = list(partitions)
    groups = imbalance(parts)
    by_key = {key: (a, s) for key, a, s in parts}
    elect: list[TopicPartition] = []
    waiting: list[TopicPartition] = []
    for broker, group in groups.items():
        if not group.elsewhere or not group.above(percentage):
            continue
        for key in group.elsewhere:
            a, s = by_key[key]
            assert s is not None                         # `elsewhere` holds only partitions with a state
            _, code = preferred_election(a, s, live, shutting_down)
            if code == ErrorCode.NONE:
                elect.append(key)
            elif broker in live and broker not in shutting_down and broker not in s.isr:
                waiting.append(key)
    return RebalancePlan(tuple(elect), tuple(waiting), groups)
