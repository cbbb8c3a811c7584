"""Group coordinator metrics: groups per state (read at scrape time), rebalances, commits, expiry."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily

from .group import GroupState


class _GroupCollector:
    """Counts groups by state when Prometheus scrapes (from its thread: copy, and skip on a race)."""

    def __init__(self, groups: Callable[[], Iterable[Any]]) -> None:
        self._groups = groups

    def collect(self):
        by_state = GaugeMetricFamily("oncelog_groups", "Consumer groups by state", labels=["state"])
        members = GaugeMetricFamily("oncelog_group_members", "Members of all consumer groups")
        counts = {state.value: 0 for state in GroupState if state is not GroupState.DEAD}
        total = 0
        try:
            for group in list(self._groups()):
                if group.state.value in counts:
                    counts[group.state.value] += 1
                total += len(group.members)
        except RuntimeError:  # the coordinator changed its group map while we copied it; next scrape
            return
        for state, count in counts.items():
            by_state.add_metric([state], count)
        members.add_metric([], total)
        yield by_state
        yield members


class GroupMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry if registry is not None else CollectorRegistry()
        self.registry = r
        self.rebalances = Counter("oncelog_group_rebalances", "Rebalances started (a group entering "
                                  "PreparingRebalance)", registry=r)
        self.offset_commits = Counter("oncelog_offset_commits", "Offsets committed, one per partition",
                                      ["kind"], registry=r)
        self.offsets_expired = Counter("oncelog_offsets_expired", "Offsets removed by retention or deletion",
                                       registry=r)

    def watch(self, groups: Callable[[], Iterable[Any]]) -> None:
        self.registry.register(_GroupCollector(groups))
