"""The data directory: topic metadata, every partition log, checkpoints, retention, clean shutdown.

Layout (Kafka's where Kafka has one):
  meta.properties                       cluster.id and node.id, created on first start
  <topic>-<partition>/                  a partition log (segments, plus `partition.metadata` with the topic id)
  recovery-point-offset-checkpoint      per partition: offsets below it are known to be on disk
  log-start-offset-checkpoint           per partition: the log start offset (DeleteRecords, retention)
  .oncelog_cleanshutdown                written last at a clean shutdown, removed at startup
  __oncelog_meta/topics/<topic>.json    topic id, partition count, config overrides (Kafka keeps these in
                                        its metadata log; a single broker does not need one) and, in cluster
                                        mode, `local`: the partitions with a replica in this directory

The topic JSON is the source of truth: a partition directory that no topic claims (a crash in the middle of
deleting a topic or adding partitions) is removed at startup, and `partition.metadata` catches a directory left
from an older topic of the same name.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import (
    TOPIC_KEYS,
    BrokerConfig,
    ConfigError,
    TopicConfig,
    parse_properties,
    parse_topic_overrides,
    topic_name_problem,
)
from ..errors import ErrorCode, KafkaError
from . import fault_injection
from .checkpoints import (
    LOG_START_OFFSET_FILE,
    RECOVERY_POINT_FILE,
    CorruptCheckpointError,
    atomic_write,
    fsync_dir,
    read_checkpoint,
    write_checkpoint,
)
from .partition import Partition
from .partition_log import PartitionLog

if TYPE_CHECKING:
    from .flusher import GroupCommitFlusher

CLEAN_SHUTDOWN_FILE = ".oncelog_cleanshutdown"
META_PROPERTIES_FILE = "meta.properties"
META_DIR = "__oncelog_meta"
PARTITION_METADATA_FILE = "partition.metadata"

log = logging.getLogger(__name__)


class LogDirError(RuntimeError):
    """The data directory cannot be used as it is (another node's, unreadable metadata)."""


@dataclass
class TopicMeta:
    name: str
    topic_id: bytes
    partitions: int  # the topic's partition count (in cluster mode: cluster-wide, not only the local ones)
    config: TopicConfig
    internal: bool = False
    # Cluster mode: the partitions with a replica in this directory. None: every partition (the single node).
    local: set[int] | None = None

    def local_partitions(self) -> list[int]:
        return list(range(self.partitions)) if self.local is None else sorted(self.local)


def new_cluster_id() -> str:
    """22-character base64url of a random UUID, as Kafka's `Uuid.toString`; never starting with '-', which
    Kafka avoids so that the id cannot be mistaken for a command-line flag."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class CheckpointOffsets:
    """One snapshot of the checkpoint files' contents, numbered in the order taken."""

    seq: int
    recovery: dict[tuple[str, int], int]
    starts: dict[tuple[str, int], int]


class LogManager:
    """Owns every PartitionLog of the broker. Methods run on the event-loop thread."""

    def __init__(
        self,
        data_dir: str | os.PathLike,
        broker_config: BrokerConfig,
        flusher: GroupCommitFlusher | None = None,
        now_ms: Callable[[], int] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.config = broker_config
        self.flusher = flusher
        self.node_id: int = broker_config["node.id"]
        self.cluster_id = ""
        self.topics: dict[str, TopicMeta] = {}
        self.clean_startup = False  # whether the previous shutdown was clean (producer state may care)
        self._now_ms = now_ms or _now_ms
        self._fsync: bool = broker_config["oncelog.fsync.enable"]
        fault_injection.configure(broker_config["oncelog.test.fail.fsync.file"])
        fault_injection.configure_crash(broker_config["oncelog.test.crash.at"])
        self._logs: dict[tuple[str, int], PartitionLog] = {}
        self._partitions: dict[tuple[str, int], Partition] = {}
        self._creating: set[str] = set()  # topics create_topic_off_loop is building on a worker thread
        # The transaction coordinator's verification hook, given to every partition (KIP-890 part 1).
        self.verify_transaction: Any = None
        self._checkpoint_lock = threading.Lock()
        self._checkpoint_seq = 0  # numbers the snapshots checkpoint_offsets takes
        self._checkpoint_written = 0  # the newest of them written

    @property
    def _topics_dir(self) -> Path:
        return self.data_dir / META_DIR / "topics"

    # -- startup / shutdown -------------------------------------------------------------------------------
    def startup(self, cluster_id: str | None = None) -> None:
        """Open the directory. `cluster_id` (cluster mode: the one the coordination service holds) is written
        into a new directory's meta.properties, and a directory of another cluster is refused."""
        self._topics_dir.mkdir(parents=True, exist_ok=True)
        self._load_meta_properties(cluster_id)
        marker = self.data_dir / CLEAN_SHUTDOWN_FILE
        clean = marker.exists()
        self.clean_startup = clean
        recovery_points = self._read_checkpoint(RECOVERY_POINT_FILE)
        log_starts = self._read_checkpoint(LOG_START_OFFSET_FILE)
        if recovery_points is None:
            clean = False  # recover everything rather than trust a point we cannot read
            recovery_points = {}
        for meta in self._load_topics():
            self.topics[meta.name] = meta
        for meta in self.topics.values():
            for p in meta.local_partitions():
                self._open_log(meta, p, recovery_points.get((meta.name, p), 0),
                               (log_starts or {}).get((meta.name, p), 0), clean)
        self._remove_stray_dirs()
        if marker.exists():
            marker.unlink()
            fsync_dir(self.data_dir)
        self.checkpoint()
        if not self.topics and not self.clean_startup:
            how = "new or empty data directory"
        else:
            how = "after a clean shutdown" if self.clean_startup else "recovered after an unclean shutdown"
        log.info("loaded %d topics, %d partitions from %s (%s)", len(self.topics), len(self._logs), self.data_dir, how)

    def shutdown(self) -> None:
        """Close every log (fsyncing it), write the checkpoints, then the clean-shutdown marker, last, and only
        if everything before it succeeded. Stop the flusher first."""
        ok = True
        for key, plog in self._logs.items():
            try:
                partition = self._partitions.get(key)
                if partition is not None:
                    partition.close()
                else:
                    plog.close()
            except OSError:
                ok = False
                log.exception("closing %s failed", plog.name)
            if plog.offline:
                ok = False
        try:
            self.checkpoint()
        except OSError:
            ok = False
            log.exception("writing checkpoints at shutdown failed")
        if ok:
            atomic_write(self.data_dir / CLEAN_SHUTDOWN_FILE, b"")
        else:
            log.warning("not marking the shutdown clean: the next start recovers the logs")
        self._logs.clear()
        self._partitions.clear()

    def _load_meta_properties(self, expected_cluster_id: str | None = None) -> None:
        path = self.data_dir / META_PROPERTIES_FILE
        if path.exists():
            props = parse_properties(path.read_text(encoding="utf-8"))
            cluster_id = props.get("cluster.id", "")
            if not cluster_id:
                raise LogDirError(f"{path} has no cluster.id")
            if expected_cluster_id is not None and cluster_id != expected_cluster_id:
                raise LogDirError(
                    f"The data directory {self.data_dir} belongs to cluster {cluster_id}, but the coordination "
                    f"service holds cluster {expected_cluster_id}; use another directory or another chroot"
                )
            stored = props.get("node.id")
            if stored is not None and stored.strip() != str(self.node_id):
                raise LogDirError(
                    f"The data directory {self.data_dir} belongs to node {stored.strip()}, but node.id is "
                    f"{self.node_id}; use another directory or set node.id={stored.strip()}"
                )
            self.cluster_id = cluster_id
            return
        self.cluster_id = expected_cluster_id or new_cluster_id()
        text = f"#oncelog\nversion=1\ncluster.id={self.cluster_id}\nnode.id={self.node_id}\n"
        atomic_write(path, text.encode())

    def _read_checkpoint(self, name: str) -> dict[tuple[str, int], int] | None:
        try:
            return read_checkpoint(self.data_dir / name)
        except CorruptCheckpointError as exc:
            log.warning("%s; ignoring it", exc)
            return None

    def _load_topics(self) -> list[TopicMeta]:
        metas = []
        for entry in sorted(os.listdir(self._topics_dir)):
            path = self._topics_dir / entry
            if entry.endswith(".tmp"):
                path.unlink()
                continue
            if not entry.endswith(".json"):
                continue
            try:
                doc = json.loads(path.read_text(encoding="utf-8"))
                overrides = parse_topic_overrides(doc.get("config", {}))
                meta = TopicMeta(
                    name=doc["name"],
                    topic_id=bytes.fromhex(doc["topic_id"]),
                    partitions=int(doc["partitions"]),
                    config=self.config.topic_config(overrides),
                    internal=bool(doc.get("internal", False)),
                    local=None if doc.get("local") is None else {int(p) for p in doc["local"]},
                )
            except (ValueError, KeyError, TypeError, ConfigError) as exc:
                raise LogDirError(f"Topic metadata file {path} is unreadable: {exc}") from exc
            if entry != f"{meta.name}.json" or len(meta.topic_id) != 16 or meta.partitions < 1:
                raise LogDirError(f"Topic metadata file {path} is inconsistent")
            metas.append(meta)
        return metas

    def _write_topic_meta(self, meta: TopicMeta, partitions: int, overrides: Mapping[str, Any]) -> None:
        doc = {
            "version": 1,
            "name": meta.name,
            "topic_id": meta.topic_id.hex(),
            "partitions": partitions,
            "internal": meta.internal,
            "config": {k: TOPIC_KEYS[k].render(v) for k, v in sorted(overrides.items())},
        }
        if meta.local is not None:
            doc["local"] = sorted(meta.local)
        atomic_write(self._topics_dir / f"{meta.name}.json", (json.dumps(doc, indent=1) + "\n").encode())

    # -- partition directories ---------------------------------------------------------------------------
    def _partition_dir(self, topic: str, partition: int) -> Path:
        return self.data_dir / f"{topic}-{partition}"

    def _open_log(
        self, meta: TopicMeta, partition: int, recovery_point: int, log_start: int, clean: bool, new: bool = False
    ) -> PartitionLog:
        part = self._build_partition(meta, partition, recovery_point, log_start, clean, new)
        self._register(meta, part)
        return part.log

    def _build_partition(
        self, meta: TopicMeta, partition: int, recovery_point: int, log_start: int, clean: bool, new: bool = False
    ) -> Partition:
        """The partition's directory, files and objects; touches nothing of the manager's, so that a new topic's
        partitions can be built on a worker thread (create_topic_off_loop) and registered on the loop."""
        directory = self._partition_dir(meta.name, partition)
        marker = directory / PARTITION_METADATA_FILE
        stored = self._stored_topic_id(marker)
        if directory.exists() and (new or (stored is not None and stored != meta.topic_id)):
            log.warning("removing %s: it belongs to an older topic of the same name", directory)
            shutil.rmtree(directory)
            stored = None
        directory.mkdir(exist_ok=True)
        if stored is None:
            self._write_partition_metadata(marker, meta.topic_id)
        plog = PartitionLog.open(
            directory, meta.name, partition, meta.config, recovery_point=recovery_point,
            log_start_offset=log_start, clean=clean or new, now_ms=self._now_ms, fsync=self._fsync,
        )
        part = Partition(plog)
        part.load_producer_state(self._now_ms())
        return part

    def _register(self, meta: TopicMeta, part: Partition) -> None:
        plog = part.log
        if self.flusher is not None:
            plog.on_dirty = self.flusher.mark_dirty
        part.verify_transaction = self.verify_transaction
        self._logs[(meta.name, plog.partition)] = plog
        self._partitions[(meta.name, plog.partition)] = part

    @staticmethod
    def _stored_topic_id(path: Path) -> bytes | None:
        """Topic id from Kafka's `partition.metadata` (`version: 0`, `topic_id: <base64url uuid>`)."""
        try:
            props = parse_properties(path.read_text(encoding="utf-8"))
            text = props["topic_id"]
            return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        except (OSError, KeyError, ValueError):
            return None

    @staticmethod
    def _write_partition_metadata(path: Path, topic_id: bytes) -> None:
        text = base64.urlsafe_b64encode(topic_id).rstrip(b"=").decode()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, f"version: 0\ntopic_id: {text}\n".encode())
            os.fdatasync(fd)  # its directory entry is made durable with the partition directory
        finally:
            os.close(fd)

    def _remove_stray_dirs(self) -> None:
        for entry in os.scandir(self.data_dir):
            if not entry.is_dir() or entry.name == META_DIR:
                continue
            topic, dash, number = entry.name.rpartition("-")
            if not dash or not number.isdigit() or str(int(number)) != number:
                continue
            meta = self.topics.get(topic)
            if meta is None or int(number) not in meta.local_partitions():
                log.warning("removing %s: no topic claims this partition", entry.path)
                shutil.rmtree(entry.path, ignore_errors=True)

    # -- topics ---------------------------------------------------------------------------------------------
    def create_topic(
        self, name: str, partitions: int, overrides: Mapping[str, Any] | None = None, internal: bool = False
    ) -> TopicMeta:
        meta, parsed = self._new_topic(name, partitions, overrides, internal)
        built = self._build_topic(meta, parsed)
        return self._finish_topic(meta, built)

    async def create_topic_off_loop(
        self, name: str, partitions: int, overrides: Mapping[str, Any] | None = None, internal: bool = False
    ) -> TopicMeta:
        """create_topic with its file work on a worker thread: directories, files and fsyncs cost about 1.5 ms a
        partition here, so a CreateTopics of 2,000 partitions held the event loop, and every client of the
        broker, for 3 s (docs/latency.md). The name is reserved meanwhile; the topic appears, registered on the
        loop, only once all of it is on disk."""
        meta, parsed = self._new_topic(name, partitions, overrides, internal)
        self._creating.add(name)
        try:
            built = await asyncio.to_thread(self._build_topic, meta, parsed)
        finally:
            self._creating.discard(name)
        return self._finish_topic(meta, built)

    def is_being_created(self, name: str) -> bool:
        """A topic create_topic_off_loop is building: its name is taken, the topic not visible yet."""
        return name in self._creating

    def _new_topic(self, name: str, partitions: int, overrides: Mapping[str, Any] | None,
                   internal: bool) -> tuple[TopicMeta, dict[str, Any]]:
        problem = topic_name_problem(name)
        if problem:
            raise KafkaError(ErrorCode.INVALID_TOPIC_EXCEPTION, problem)
        if name in self.topics or name in self._creating:
            raise KafkaError(ErrorCode.TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists.")
        normalized = name.replace(".", "_")
        for other in (*self.topics, *self._creating):
            if other.replace(".", "_") == normalized:
                raise KafkaError(
                    ErrorCode.INVALID_TOPIC_EXCEPTION,
                    f"Topic '{name}' collides with existing topic: {other} ('.' and '_' collide in metric names)",
                )
        if partitions < 1:
            raise KafkaError(ErrorCode.INVALID_PARTITIONS, "Number of partitions must be larger than 0.")
        parsed = self._parse_overrides(overrides or {})
        return TopicMeta(name, self._new_topic_id(), partitions, self.config.topic_config(parsed), internal), parsed

    def _build_topic(self, meta: TopicMeta, parsed: dict[str, Any]) -> list[Partition]:
        """Every partition on disk and the topic's file written (the commit point across a restart). Touches
        nothing of the manager's but files: may run on a worker thread."""
        built: list[Partition] = []
        try:
            for p in range(meta.partitions):
                built.append(self._build_partition(meta, p, 0, 0, clean=True, new=True))
            fsync_dir(self.data_dir)
            self._write_topic_meta(meta, meta.partitions, parsed)
        except OSError as exc:
            for part in built:
                part.log.delete()
            raise KafkaError(ErrorCode.KAFKA_STORAGE_ERROR, f"Could not create topic '{meta.name}': {exc}") from exc
        return built

    def _finish_topic(self, meta: TopicMeta, built: list[Partition]) -> TopicMeta:
        for part in built:
            self._register(meta, part)
        self.topics[meta.name] = meta
        return meta

    def _new_topic_id(self) -> bytes:
        taken = {m.topic_id for m in self.topics.values()}
        while True:
            topic_id = uuid.uuid4().bytes
            if topic_id not in taken:
                return topic_id

    @staticmethod
    def _parse_overrides(overrides: Mapping[str, Any]) -> dict[str, Any]:
        try:
            return parse_topic_overrides(overrides)
        except ConfigError as exc:
            raise KafkaError(ErrorCode.INVALID_CONFIG, str(exc)) from None

    def _meta(self, name: str) -> TopicMeta:
        meta = self.topics.get(name)
        if meta is None:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"Topic '{name}' does not exist.")
        return meta

    def delete_topic(self, name: str) -> None:
        meta = self._meta(name)
        try:
            (self._topics_dir / f"{name}.json").unlink()
            fsync_dir(self._topics_dir)
        except OSError as exc:
            raise KafkaError(ErrorCode.KAFKA_STORAGE_ERROR, f"Could not delete topic '{name}': {exc}") from exc
        del self.topics[name]
        for p in meta.local_partitions():
            self._partitions.pop((name, p), None)
            plog = self._logs.pop((name, p), None)
            if plog is None:
                continue
            if self.flusher is not None:
                self.flusher.forget(plog)
            plog.delete()
        self._checkpoint_quietly()

    def create_partitions(self, name: str, total: int) -> TopicMeta:
        meta = self._meta(name)
        if total <= meta.partitions:
            why = "already has" if total == meta.partitions else "currently has"
            raise KafkaError(
                ErrorCode.INVALID_PARTITIONS,
                f"Topic {why} {meta.partitions} partitions"
                + ("." if total == meta.partitions else f", which is higher than the requested {total}."),
            )
        opened: list[PartitionLog] = []
        try:
            for p in range(meta.partitions, total):
                opened.append(self._open_log(meta, p, 0, 0, clean=True, new=True))
            fsync_dir(self.data_dir)
            self._write_topic_meta(meta, total, meta.config.overrides)
        except OSError as exc:
            for plog in opened:
                self._logs.pop((name, plog.partition), None)
                self._partitions.pop((name, plog.partition), None)
                plog.delete()
            raise KafkaError(ErrorCode.KAFKA_STORAGE_ERROR, f"Could not add partitions to '{name}': {exc}") from exc
        meta.partitions = total
        return meta

    def alter_topic_config(
        self, name: str, overrides: Mapping[str, Any], incremental: bool = False
    ) -> TopicConfig:
        """Replace the topic's overrides with `overrides` (AlterConfigs), or with `incremental` merge them into
        the current ones, a None value removing a key (IncrementalAlterConfigs). Persisted, then applied to
        every partition log."""
        meta = self._meta(name)
        if incremental:
            merged = dict(meta.config.overrides)
            for key, value in overrides.items():
                if value is None:
                    merged.pop(key, None)
                else:
                    merged[key] = value
        else:
            merged = {k: v for k, v in overrides.items() if v is not None}
        parsed = self._parse_overrides(merged)
        config = self.config.topic_config(parsed)
        try:
            self._write_topic_meta(meta, meta.partitions, parsed)
        except OSError as exc:
            raise KafkaError(ErrorCode.KAFKA_STORAGE_ERROR, f"Could not persist config of '{name}': {exc}") from exc
        meta.config = config
        for p in meta.local_partitions():
            plog = self._logs.get((name, p))
            if plog is not None:
                plog.update_config(config)
        return config

    # -- cluster mode: the replicas assigned to this broker ----------------------------------------------------
    def open_replica(self, name: str, topic_id: bytes, partition: int, partitions: int,
                     overrides: Mapping[str, Any] | None = None, internal: bool = False) -> Partition:
        """The local replica of `name`-`partition` (topic id and partition count as the cluster knows them),
        created empty if this directory has none. A local topic with another id is an older topic of the same
        name: delete it first (`delete_topic`)."""
        meta = self.topics.get(name)
        if meta is not None and meta.topic_id != topic_id:
            raise KafkaError(ErrorCode.INCONSISTENT_TOPIC_ID,
                             f"The local copy of topic '{name}' belongs to an older topic of that name")
        if meta is not None and meta.local is None:
            raise KafkaError(ErrorCode.INVALID_REQUEST, f"Topic '{name}' is a single-node topic here")
        if meta is None:
            parsed = self._parse_overrides(overrides or {})
            meta = TopicMeta(name, topic_id, partitions, self.config.topic_config(parsed), internal, set())
        part = self._partitions.get((name, partition)) if partition in meta.local else None
        if part is not None:
            return part
        try:
            plog = self._open_log(meta, partition, 0, 0, clean=True, new=True)
            fsync_dir(self.data_dir)
            meta.local.add(partition)
            meta.partitions = max(meta.partitions, partitions, partition + 1)
            self._write_topic_meta(meta, meta.partitions, meta.config.overrides)
        except OSError as exc:
            meta.local.discard(partition)
            self._partitions.pop((name, partition), None)
            opened = self._logs.pop((name, partition), None)
            if opened is not None:
                opened.delete()
            raise KafkaError(ErrorCode.KAFKA_STORAGE_ERROR, f"Could not create {name}-{partition}: {exc}") from exc
        self.topics[name] = meta
        return self._partitions[(name, plog.partition)]

    def set_partition_count(self, name: str, partitions: int) -> None:
        """Cluster mode: the topic's partition count grew (CreatePartitions elsewhere); persisted."""
        meta = self._meta(name)
        if partitions > meta.partitions:
            meta.partitions = partitions
            self._write_topic_meta(meta, partitions, meta.config.overrides)

    def delete_replica(self, name: str, partition: int) -> None:
        """Cluster mode: this directory's replica of one partition goes (a reassignment moved it away); the topic
        file goes with its last local replica."""
        meta = self._meta(name)
        local = set(meta.local_partitions())
        if partition not in local:
            return
        if local == {partition}:
            self.delete_topic(name)
            return
        if meta.local is None:
            meta.local = local
        meta.local.discard(partition)
        self._write_topic_meta(meta, meta.partitions, meta.config.overrides)
        self._partitions.pop((name, partition), None)
        plog = self._logs.pop((name, partition), None)
        if plog is not None:
            if self.flusher is not None:
                self.flusher.forget(plog)
            plog.delete()
        self._checkpoint_quietly()

    # -- logs -----------------------------------------------------------------------------------------------
    def get_log(self, topic: str, partition: int) -> PartitionLog | None:
        return self._logs.get((topic, partition))

    def set_verify_transaction(self, hook: Any) -> None:
        self.verify_transaction = hook
        for part in self._partitions.values():
            part.verify_transaction = hook

    def get_partition(self, topic: str, partition: int) -> Partition | None:
        return self._partitions.get((topic, partition))

    def all_partitions(self) -> list[Partition]:
        return list(self._partitions.values())

    def expire_producers(self, now_ms: int | None = None) -> int:
        """Age idle producer state: cached batches after producer.id.expiration.ms, the whole entry after
        transactional.id.expiration.ms (never with an open transaction)."""
        now = self._now_ms() if now_ms is None else now_ms
        limit = self.config["producer.id.expiration.ms"]
        forget = self.config["transactional.id.expiration.ms"]
        count = 0
        for part in list(self._partitions.values()):
            gone = part.expire_producers(now, limit, forget)
            if gone:
                log.info("%s: expired producer state of %s", part.name, gone)
                count += len(gone)
        return count

    def all_logs(self) -> list[PartitionLog]:
        return list(self._logs.values())

    def delete_records(self, topic: str, partition: int, offset: int) -> int:
        """DeleteRecords on one partition, with the log start offset checkpointed before returning."""
        plog = self.get_log(topic, partition)
        if plog is None:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        before = plog.log_start_offset
        start = plog.delete_records_before(offset)
        if start != before:
            self.checkpoint()
        return start

    # -- replication: a follower's storage operations, checkpointed ---------------------------------------------
    def _partition(self, topic: str, partition: int) -> Partition:
        part = self._partitions.get((topic, partition))
        if part is None:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{topic}-{partition} is not in this log directory")
        return part

    def truncate_to(self, topic: str, partition: int, offset: int) -> int:
        """`Partition.truncate_to`, then the checkpoints: a recovery point left above the new end would let the
        next start skip checking the segments that new, unsynced appends go to (Kafka checkpoints too)."""
        end = self._partition(topic, partition).truncate_to(offset, self._now_ms())
        self.checkpoint()
        return end

    def truncate_fully_and_start_at(self, topic: str, partition: int, offset: int) -> None:
        """`Partition.truncate_fully_and_start_at`, then the checkpoints (the log start offset moved too)."""
        self._partition(topic, partition).truncate_fully_and_start_at(offset, self._now_ms())
        self.checkpoint()

    def advance_log_start(self, topic: str, partition: int, offset: int) -> int:
        """`Partition.advance_log_start` (a follower taking the leader's log start offset), checkpointed when
        it moved, so a restart or a failover never brings deleted records back (seed 000)."""
        part = self._partition(topic, partition)
        before = part.log.log_start_offset
        start = part.advance_log_start(offset)
        if start != before:
            self.checkpoint()
        return start

    def run_retention(self, now_ms: int | None = None) -> int:
        """Apply retention to every log; returns the number of segments deleted. Log start offsets that moved
        are checkpointed at once, so deleted records do not come back after a crash."""
        now = self._now_ms() if now_ms is None else now_ms
        deleted = 0
        moved = False
        for plog in list(self._logs.values()):
            before = plog.log_start_offset
            try:
                deleted += plog.apply_retention(now)
            except Exception:
                log.exception("retention failed for %s", plog.name)
            moved = moved or plog.log_start_offset != before
        if moved:
            self._checkpoint_quietly()
        return deleted

    def checkpoint(self) -> None:
        """Write both checkpoint files (fsynced, atomic), now. The recovery point is each log's `recovery_point`,
        which equals the high watermark when fsync is enabled."""
        self.write_checkpoints(self.checkpoint_offsets())

    def checkpoint_offsets(self) -> CheckpointOffsets:
        """What the checkpoint files would hold now, numbered: taken on the loop (where the logs change), written
        by `write_checkpoints` on any thread (the periodic checkpoint writes off the loop: its four fsyncs,
        behind the flush thread's, held the loop for milliseconds to tens of them)."""
        logs = list(self._logs.items())
        self._checkpoint_seq += 1
        return CheckpointOffsets(self._checkpoint_seq, {key: plog.recovery_point for key, plog in logs},
                                 {key: plog.log_start_offset for key, plog in logs})

    def write_checkpoints(self, offsets: CheckpointOffsets) -> None:
        """Write `offsets` unless newer ones were written meanwhile (a checkpoint written on the loop while an
        older one waited for its thread must not be overwritten by it)."""
        with self._checkpoint_lock:
            if offsets.seq <= self._checkpoint_written:
                return
            write_checkpoint(self.data_dir / RECOVERY_POINT_FILE, offsets.recovery)
            write_checkpoint(self.data_dir / LOG_START_OFFSET_FILE, offsets.starts)
            self._checkpoint_written = offsets.seq

    def _checkpoint_quietly(self) -> None:
        try:
            self.checkpoint()
        except OSError:
            log.exception("writing checkpoints failed")
