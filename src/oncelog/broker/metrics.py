"""Broker metrics in Prometheus text format.

Counters are updated on the request path (a dict lookup and an add); per-partition
gauges are collected lazily at scrape time from the live logs, so the hot path pays
nothing for them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, Summary, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

log = logging.getLogger("oncelog.metrics")

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_LOOP_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class _PartitionCollector:
    """Reads partition gauges from the broker's logs when Prometheus scrapes."""

    def __init__(self, logs: Callable[[], Iterable[tuple[str, int, Any]]],
                 partitions: Callable[[], Iterable[Any]] | None = None) -> None:
        self._logs = logs
        self._partitions = partitions

    def collect(self):
        size = GaugeMetricFamily("oncelog_log_size_bytes", "Bytes on disk of a partition log", labels=["topic", "partition"])
        start = GaugeMetricFamily("oncelog_log_start_offset", "Log start offset", labels=["topic", "partition"])
        end = GaugeMetricFamily("oncelog_log_end_offset", "Log end offset", labels=["topic", "partition"])
        hwm = GaugeMetricFamily("oncelog_high_watermark", "Durable end of the log", labels=["topic", "partition"])
        segments = GaugeMetricFamily("oncelog_log_segments", "Segments of a partition log", labels=["topic", "partition"])
        try:
            items = list(self._logs())
        except RuntimeError:  # the broker changed its partition map while we copied it; next scrape
            items = []
        for topic, partition, plog in items:
            labels = [topic, str(partition)]
            size.add_metric(labels, plog.size_bytes)
            start.add_metric(labels, plog.log_start_offset)
            end.add_metric(labels, plog.log_end_offset)
            hwm.add_metric(labels, plog.high_watermark)
            segments.add_metric(labels, len(plog.segments))
        yield from (size, start, end, hwm, segments)
        if self._partitions is None:
            return
        producers = GaugeMetricFamily("oncelog_producer_ids", "Producer ids with state on a partition",
                                      labels=["topic", "partition"])
        rules = CounterMetricFamily(
            "oncelog_producer_state_verdicts",
            "Produce batches answered by a producer-state rule other than a plain append", labels=["rule"],
        )
        lso_lag = GaugeMetricFamily("oncelog_last_stable_offset_lag",
                                    "High watermark minus last stable offset (records held back by open transactions)",
                                    labels=["topic", "partition"])
        totals: dict[str, int] = {}
        try:
            parts = list(self._partitions())
        except RuntimeError:
            parts = []
        for part in parts:
            producers.add_metric([part.topic, str(part.index)], len(part.producers.entries))
            lso_lag.add_metric([part.topic, str(part.index)], part.log.high_watermark - part.last_stable_offset)
            for rule, count in part.producers.stats.items():
                totals[rule] = totals.get(rule, 0) + count
        for rule, count in sorted(totals.items()):
            rules.add_metric([rule], count)
        yield producers
        yield rules
        yield lso_lag


class _TransactionCollector:
    """Transaction coordinator figures, read at scrape time."""

    def __init__(self, broker: Any) -> None:
        self._broker = broker

    def collect(self):
        coordinator = self._broker.txn_coordinator
        states = GaugeMetricFamily("oncelog_transactions", "Transactional ids by state", labels=["state"])
        outcomes = CounterMetricFamily("oncelog_transactions_ended", "Transactions ended, by how",
                                       labels=["outcome"])
        late = GaugeMetricFamily(
            "oncelog_partitions_with_late_transactions",
            "Partitions holding an open transaction older than transaction.max.timeout.ms + 5 minutes",
        )
        if coordinator is not None:
            for name, count in sorted(coordinator.state_counts().items()):
                states.add_metric([name], count)
            for outcome, count in sorted(coordinator.stats.items()):
                outcomes.add_metric([outcome], count)
        limit = self._broker.config["transaction.max.timeout.ms"] + 300_000
        now = time.time() * 1000
        count = 0
        try:
            parts = list(self._broker.logs.all_partitions())
        except RuntimeError:
            parts = []
        for part in parts:
            entries = part.producers.entries
            if any(now - entries[pid].last_append_ms > limit for pid in list(part.producers.ongoing) if pid in entries):
                count += 1
        late.add_metric([], count)
        yield from (states, outcomes, late)


class _CleanerCollector:
    """The log cleaner's figures under Kafka's names (kafka.log:type=LogCleaner / LogCleanerManager), read at
    scrape time; nothing when the cleaner is off."""

    def __init__(self, cleaner: Callable[[], Any], log_dir: str) -> None:
        self._cleaner = cleaner
        self._log_dir = log_dir

    def collect(self):
        cleaner = self._cleaner()
        if cleaner is None:
            return
        stats = cleaner.stats
        p = "oncelog_log_cleaner_"

        def gauge(name: str, doc: str, value: float, labels: dict[str, str] | None = None) -> GaugeMetricFamily:
            g = GaugeMetricFamily(p + name, doc, labels=list(labels or {}))
            g.add_metric(list((labels or {}).values()), value)
            return g

        since = (time.monotonic() - stats.last_pass_monotonic) * 1000 if stats.last_pass_monotonic else 0.0
        uncleanable = list(stats.uncleanable.values())
        yield gauge("max_dirty_percent", "max-dirty-percent: the highest dirty ratio of the last pass, in %",
                    stats.max_dirty_percent)
        yield gauge("time_since_last_run_ms", "time-since-last-run-ms: since the cleaner last looked at the logs",
                    since)
        yield gauge("max_clean_time_secs", "max-clean-time-secs: the longest of the workers' last rounds",
                    stats.max_clean_time_secs)
        yield gauge("cleaner_recopy_percent", "cleaner-recopy-percent: bytes written / bytes read of the workers' "
                    "last rounds, in %", stats.recopy_percent)
        yield gauge("max_buffer_utilization_percent", "max-buffer-utilization-percent: offset map fill of the "
                    "workers' last rounds, in %", stats.max_buffer_utilization_percent)
        yield gauge("max_compaction_delay_secs", "max-compaction-delay-secs: how far past max.compaction.lag.ms "
                    "the rounds of the last pass started", stats.max_compaction_delay_ms / 1000)
        yield gauge("uncleanable_partitions_count", "uncleanable-partitions-count: partitions the cleaner gave up "
                    "on until a restart", len(uncleanable), {"log_dir": self._log_dir})
        yield gauge("uncleanable_bytes", "uncleanable-bytes: bytes of the closed segments of those partitions",
                    sum(uncleanable), {"log_dir": self._log_dir})
        rounds = CounterMetricFamily(p + "rounds", "Cleaning rounds swapped in")
        rounds.add_metric([], stats.rounds)
        read = CounterMetricFamily(p + "read_bytes", "Bytes the cleaner read (map and copy)")
        read.add_metric([], stats.bytes_read)
        written = CounterMetricFamily(p + "written_bytes", "Bytes of cleaned segments written")
        written.add_metric([], stats.bytes_written)
        busy = CounterMetricFamily(p + "busy_seconds", "Time spent in rounds by the worker processes")
        busy.add_metric([], stats.seconds)
        yield from (rounds, read, written, busy)


class BrokerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.bytes_in = Counter("oncelog_bytes_in", "Record bytes appended", ["topic"], registry=r)
        self.messages_in = Counter("oncelog_messages_in", "Records appended", ["topic"], registry=r)
        self.bytes_out = Counter("oncelog_bytes_out", "Record bytes sent to consumers", ["topic"], registry=r)
        self.messages_out = Counter(
            "oncelog_messages_out",
            "Records delivered to consumers, counted when a consumer's next fetch moves past them",
            ["topic"], registry=r,
        )
        self.requests = Counter("oncelog_requests", "Requests answered", ["api"], registry=r)
        self.request_errors = Counter("oncelog_request_failures", "Requests that closed the connection", ["api"], registry=r)
        self.request_latency = Histogram(
            "oncelog_request_latency_seconds", "Time from request arrival to response ready", ["api"],
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.produce_failures = Counter(
            "oncelog_produce_validation_failures",
            "Produced batches rejected by validation (KIP-467), by failure kind",
            ["kind"], registry=r,
        )
        self.connections = Counter("oncelog_connections_accepted", "Connections accepted", registry=r)
        # Kafka's selector metrics (successful-authentication-total, ...), per listener and mechanism
        self.authentications = Counter("oncelog_successful_authentication", "SASL authentications that succeeded",
                                       ["listener", "mechanism"], registry=r)
        self.reauthentications = Counter("oncelog_successful_reauthentication",
                                         "SASL re-authentications (KIP-368) that succeeded",
                                         ["listener", "mechanism"], registry=r)
        self.failed_authentications = Counter("oncelog_failed_authentication",
                                              "SASL authentications and TLS handshakes refused (mechanism '' for TLS)",
                                              ["listener", "mechanism"], registry=r)
        # Kafka's quota throttle metrics: throttle-time of the Produce and Fetch quota types per user/client-id (the
        # quota's metric tags, "" where unused), and the listener's connection-accept-throttle-time; Kafka's are an
        # Avg over the throttled requests, here _sum / _count of the throttle times (ms) of throttled requests only.
        self.throttle_time = Summary("oncelog_throttle_time_ms",
                                     "Throttle times given for client quota violations (KIP-219), by quota type",
                                     ["quota_type", "user", "client_id"], registry=r)
        self.connection_accept_throttle_time = Summary(
            "oncelog_connection_accept_throttle_time_ms",
            "Delays of new connections over max.connection.creation.rate, by listener", ["listener"], registry=r)
        # The event loop's health (broker/loop_monitor.py): how late it runs what is due, stalls over
        # oncelog.loop.stall.threshold.ms, and garbage collection pauses by generation.
        self.loop_lag = Histogram("oncelog_event_loop_lag_seconds",
                                  "How late the event loop ran a callback that was due (heartbeat every 10 ms)",
                                  buckets=_LOOP_BUCKETS, registry=r)
        self.loop_stalls = Counter("oncelog_event_loop_stalls",
                                   "Event loop stalls over oncelog.loop.stall.threshold.ms (each logged)", registry=r)
        self.gc_pause = Histogram("oncelog_gc_pause_seconds", "Garbage collection pauses, by generation",
                                  ["generation"], buckets=_LOOP_BUCKETS, registry=r)
        # The group commit's rounds (storage/flusher.py): each round from hand-off to results, and the flush thread's
        # own time in the disk; with fsync before the ack, a round is the floor of the answers it covers.
        self.fsync_round = Histogram("oncelog_fsync_round_seconds",
                                     "Group-commit fsync rounds, from the hand-off to the flush thread to the results",
                                     buckets=_LOOP_BUCKETS, registry=r)
        self.fsync_disk = Histogram("oncelog_fsync_disk_seconds",
                                    "The flush thread's time in the disk (writeback and syncs) per round",
                                    buckets=_LOOP_BUCKETS, registry=r)
        self._http = None

    def observe_flush_round(self, timing: Any) -> None:
        """storage/flusher.py's FlushRound of each round."""
        self.fsync_round.observe(timing.round_s)
        self.fsync_disk.observe(timing.disk_s)

    def watch_partitions(self, logs: Callable[[], Iterable[tuple[str, int, Any]]],
                         partitions: Callable[[], Iterable[Any]] | None = None) -> None:
        self.registry.register(_PartitionCollector(logs, partitions))

    def watch_transactions(self, broker: Any) -> None:
        self.registry.register(_TransactionCollector(broker))

    def watch_cleaner(self, cleaner: Callable[[], Any], log_dir: str) -> None:
        self.registry.register(_CleanerCollector(cleaner, log_dir))

    def serve(self, host: str, port: int) -> int:
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        self._http = server
        return server.server_port

    def stop(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http = None
