"""The znode layout under the chroot (docs/cluster.md §2) and, per znode kind, its JSON value: pure code, no
session. Every value carries a `version` field (FORMAT_VERSION); readers take what they know and default the
rest, so a newer writer's extra fields do not break an older reader."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from ..metadata_image import PartitionAssignment, PartitionState, TopicDeletion, TopicInfo

DEFAULT_CHROOT = "/oncelog"
FORMAT_VERSION = 1

BROKERS = "/brokers/ids"
CONTROLLER = "/controller"
CONTROLLER_EPOCH = "/controller_epoch"
CLUSTER_ID = "/cluster_id"
TOPICS = "/topics"
TOPIC_CONFIGS = "/configs/topics"
DELETING = "/deleting"
PRODUCER_ID_BLOCK = "/latest_producer_id_block"

MAX_MULTI_BYTES = 1_000_000      # under ZooKeeper's default jute.maxbuffer (0xfffff), with room for the header


class Stat(Protocol):
    """What the codecs read of a znode's stat (kazoo's ZnodeStat has these)."""

    version: int
    czxid: int


def topic_path(topic: str) -> str:
    return f"{TOPICS}/{topic}"


def state_path(topic: str, partition: int) -> str:
    return f"{TOPICS}/{topic}/partitions/{partition}/state"


def encode_topic_id(topic_id: bytes) -> str:
    """Kafka's Uuid string form: URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(topic_id).decode().rstrip("=")


def decode_topic_id(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def new_cluster_id() -> str:
    return encode_topic_id(uuid.uuid4().bytes)


def dump(value: dict[str, Any]) -> bytes:
    return json.dumps({"version": FORMAT_VERSION, **value}, separators=(",", ":"), sort_keys=True).encode()


def load(data: bytes | None) -> dict[str, Any]:
    value = json.loads(data or b"{}")
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


def state_json(state: PartitionState) -> bytes:
    return dump({"leader": state.leader, "leader_epoch": state.leader_epoch, "isr": list(state.isr),
                  "controller_epoch": state.controller_epoch, "log_start_floor": state.log_start_floor})


def state_from(data: bytes, stat: Stat) -> PartitionState:
    v = load(data)
    return PartitionState(int(v["leader"]), int(v["leader_epoch"]), tuple(int(r) for r in v["isr"]),
                          int(v.get("controller_epoch", 0)), stat.version, int(v.get("log_start_floor", 0)))


def topic_json(topic_id: bytes, assignment: Mapping[int, PartitionAssignment], creating: bool = False) -> bytes:
    value: dict[str, Any] = {
        "topic_id": encode_topic_id(topic_id),
        "replicas": {str(p): list(a.replicas) for p, a in sorted(assignment.items())},
        "adding": {str(p): list(a.adding) for p, a in sorted(assignment.items()) if a.adding},
        "removing": {str(p): list(a.removing) for p, a in sorted(assignment.items()) if a.removing},
    }
    if creating:
        value["creating"] = True        # created in steps (too big for one request): invisible until cleared
    return dump(value)


def creating(data: bytes) -> bool:
    return bool(load(data).get("creating"))


def topic_from(name: str, data: bytes, stat: Stat) -> TopicInfo:
    v = load(data)
    adding, removing = v.get("adding", {}), v.get("removing", {})
    assignment = {
        int(p): PartitionAssignment(tuple(int(r) for r in replicas), tuple(int(r) for r in adding.get(p, ())),
                                    tuple(int(r) for r in removing.get(p, ())))
        for p, replicas in v["replicas"].items()
    }
    return TopicInfo(name, decode_topic_id(v["topic_id"]), assignment, stat.version, stat.czxid)


def deletion_json(pending: Mapping[bytes, Sequence[int]]) -> bytes:
    return dump({"topics": [{"topic_id": encode_topic_id(t), "replicas": sorted(set(r))}
                             for t, r in pending.items()]})


def deletion_from(name: str, data: bytes, stat: Stat) -> TopicDeletion:
    v = load(data)
    pending = {decode_topic_id(e["topic_id"]): tuple(int(r) for r in e["replicas"]) for e in v.get("topics", [])}
    return TopicDeletion(name, pending, stat.version, stat.czxid)


def as_assignment(value: PartitionAssignment | Sequence[int]) -> PartitionAssignment:
    return value if isinstance(value, PartitionAssignment) else PartitionAssignment(tuple(value))


def endpoints_from(value: Mapping[str, Any]) -> tuple[tuple[str, str, int], ...]:
    """A broker znode's `endpoints` ("NAME://host:port" each, Kafka's layout) as (name, host, port) tuples."""
    out = []
    for item in value.get("endpoints") or ():
        name, sep, address = str(item).partition("://")
        host, _, port = address.rpartition(":")
        if sep and port.isdigit():
            out.append((name.upper(), host.strip("[]"), int(port)))
    return tuple(out)
