"""ElectLeaders (43), AlterPartitionReassignments (45), ListPartitionReassignments (46), and the inter-broker
ControlledShutdown (7).

In cluster mode the controller elects and reassigns (controller_requests.py: forwarded when this broker is not the
controller, answered once this broker's image shows the result); ListPartitionReassignments reads the image.

On the single node the three client APIs answer what a one-broker Kafka answers, so admin tools work the same
against both: every partition is already led by its preferred (only) replica (ELECTION_NOT_NEEDED; an election of
every partition lists none), a reassignment onto this broker is already complete, one onto any other broker names
the broker that is not registered, cancelling answers NO_REASSIGNMENT_IN_PROGRESS, and none is ever ongoing.
ControlledShutdown is served only to other brokers (never advertised) and only by the controller.

Authorization before anything else, as Kafka's (authorizeClusterOperation, the request's getErrorResponse):
ElectLeaders and AlterPartitionReassignments need ALTER on the cluster, ListPartitionReassignments DESCRIBE,
ControlledShutdown CLUSTER_ACTION; refused, every partition named and the top-level error (where the version has
one) are CLUSTER_AUTHORIZATION_FAILED.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...errors import ErrorCode
from ...protocol.apis import ApiKey
from ...protocol.messages import decode_request, encode_response
from ...security.acls import ResourceType
from ...security.api_acls import request_name
from . import controller_requests

if TYPE_CHECKING:
    from ..context import BrokerServices, RequestContext

PREFERRED, UNCLEAN = 0, 1
UNKNOWN_PARTITION = "This server does not host this topic-partition."
# Kafka's message is "Request <the request> is not authorized."; the request's description is its own
_NOT_AUTHORIZED = "Request {} is not authorized."
NOT_NEEDED = "Leader election not needed for topic partition."


def _partition_exists(broker: BrokerServices, topic: str, index: int) -> bool:
    cluster = getattr(broker, "cluster", None)
    if cluster is not None:
        return cluster.image.assignment(topic, index) is not None
    meta = broker.logs.topics.get(topic)
    return meta is not None and 0 <= index < meta.partitions


def _denied_message(ctx: RequestContext) -> str:
    return _NOT_AUTHORIZED.format(request_name(ctx.api_key))


# -- ElectLeaders -----------------------------------------------------------------------------------------------
def _election_response(version: int, results: dict[tuple[str, int], tuple[int, str | None]],
                       top_error: int = 0) -> dict[str, Any]:
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (topic, p), (code, message) in sorted(results.items()):
        by_topic.setdefault(topic, []).append({"partition_id": p, "error_code": code, "error_message": message})
    data: dict[str, Any] = {"throttle_time_ms": 0, "replica_election_results": [
        {"topic": t, "partition_result": parts} for t, parts in by_topic.items()]}
    if version >= 1:
        data["error_code"] = top_error
    return data


async def handle_elect_leaders(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.ELECT_LEADERS, ctx.api_version, body)
    election_type = req.election_type if ctx.api_version >= 1 else PREFERRED
    wanted = None if req.topic_partitions is None else [
        (t.topic, p) for t in req.topic_partitions for p in t.partitions]
    if not ctx.authorized_cluster():
        denied = (ctx.denial(ResourceType.CLUSTER), _denied_message(ctx))
        return encode_response(ApiKey.ELECT_LEADERS, ctx.api_version,
                               _election_response(ctx.api_version, dict.fromkeys(wanted or [], denied), denied[0]))
    if election_type not in (PREFERRED, UNCLEAN):
        results = {k: (ErrorCode.INVALID_REQUEST, f"Unknown election type {election_type}") for k in wanted or []}
        return encode_response(ApiKey.ELECT_LEADERS, ctx.api_version,
                               _election_response(ctx.api_version, results, ErrorCode.INVALID_REQUEST))
    if not controller_requests.in_cluster(broker):
        results = {k: ((ErrorCode.ELECTION_NOT_NEEDED, NOT_NEEDED) if _partition_exists(broker, *k)
                       else (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_PARTITION)) for k in wanted or []}
        return encode_response(ApiKey.ELECT_LEADERS, ctx.api_version, _election_response(ctx.api_version, results))
    cluster = broker.cluster
    image = cluster.image

    async def run_here() -> dict[str, Any]:
        from ...cluster.controller import ElectionType

        outcome = await cluster.controller.elect_leaders(wanted, ElectionType(election_type))
        results = {k: (int(r.code), r.message) for k, r in outcome.items()
                   # Kafka leaves out what needed no election when asked to elect every partition.
                   if wanted is not None or r.code != ErrorCode.ELECTION_NOT_NEEDED}
        return _election_response(ctx.api_version, results)

    def settled(response: Any) -> Any:
        elected = [(t.topic, p.partition_id) for t in response.replica_election_results for p in t.partition_result
                   if p.error_code == 0]

        def done() -> bool:
            for topic, p in elected:
                state, assignment = image.partition(topic, p), image.assignment(topic, p)
                if state is None or assignment is None:
                    continue
                if election_type == PREFERRED and state.leader != assignment.replicas[0]:
                    return False
                if election_type == UNCLEAN and state.leader < 0:
                    return False
            return True

        return done

    def failed(code: ErrorCode, message: str) -> dict[str, Any]:
        return _election_response(ctx.api_version, {k: (code, message) for k in wanted or []})

    return await controller_requests.answer(broker, ctx, body, req.timeout_ms, run_here, settled, failed)


# -- AlterPartitionReassignments -----------------------------------------------------------------------------------
def _reassignment_response(results: dict[tuple[str, int], tuple[int, str | None]], top_error: int = 0,
                           top_message: str | None = None) -> dict[str, Any]:
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (topic, p), (code, message) in results.items():
        by_topic.setdefault(topic, []).append({"partition_index": p, "error_code": code, "error_message": message})
    return {"throttle_time_ms": 0, "allow_replication_factor_change": True, "error_code": top_error,
            "error_message": top_message,
            "responses": [{"name": t, "partitions": parts} for t, parts in by_topic.items()]}


async def handle_alter_partition_reassignments(broker: BrokerServices, ctx: RequestContext,
                                               body: memoryview) -> bytes:
    from ...cluster.placement import PlacementError, validate_replicas

    req = decode_request(ApiKey.ALTER_PARTITION_REASSIGNMENTS, ctx.api_version, body)
    allow_rf_change = req.allow_replication_factor_change if ctx.api_version >= 1 else True
    targets = {(t.name, p.partition_index): None if p.replicas is None else list(p.replicas)
               for t in req.topics for p in t.partitions}
    if not ctx.authorized_cluster():
        code, message = ctx.denial(ResourceType.CLUSTER), _denied_message(ctx)
        return encode_response(ApiKey.ALTER_PARTITION_REASSIGNMENTS, ctx.api_version, _reassignment_response(
            dict.fromkeys(targets, (code, message)), code, message))
    cluster = getattr(broker, "cluster", None)

    def refused(key: tuple[str, int], target: list[int] | None) -> tuple[int, str] | None:
        if not _partition_exists(broker, *key):
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_PARTITION
        if target is not None and not allow_rf_change:
            current = len(cluster.image.assignment(*key).target) if cluster is not None else 1
            if len(target) != current:
                return (ErrorCode.INVALID_REPLICATION_FACTOR,
                        f"The replication factor is changed from {current} to {len(target)} but "
                        f"allowReplicationFactorChange is false")
        return None

    if cluster is None:
        results: dict[tuple[str, int], tuple[int, str | None]] = {}
        for key, target in targets.items():
            problem = refused(key, target)
            if problem is None and target is None:
                problem = (ErrorCode.NO_REASSIGNMENT_IN_PROGRESS,
                           f"No ongoing reassignment for partition {key[0]}-{key[1]}.")
            if problem is None:
                try:
                    validate_replicas(target, {broker.node_id}, None)
                except PlacementError as exc:
                    problem = (exc.code, exc.message)
            results[key] = problem or (ErrorCode.NONE, None)
        return encode_response(ApiKey.ALTER_PARTITION_REASSIGNMENTS, ctx.api_version,
                               _reassignment_response(results))
    image = cluster.image
    before = {t: info.version for t, info in image.topics.items() if any(k[0] == t for k in targets)}

    async def run_here() -> dict[str, Any]:
        results: dict[tuple[str, int], tuple[int, str | None]] = {}
        asked = {}
        for key, target in targets.items():
            problem = refused(key, target)
            if problem is not None:
                results[key] = problem
            else:
                asked[key] = target
        if asked:
            outcome = await cluster.controller.alter_reassignments(asked)
            results.update({k: (int(r.code), r.message) for k, r in outcome.items()})
        return _reassignment_response({k: results[k] for k in targets})

    def settled(response: Any) -> Any:
        changed = {t.name for t in response.responses if any(p.error_code == 0 for p in t.partitions)}

        def done() -> bool:
            for topic in changed:
                info = image.topics.get(topic)
                if info is not None and topic in before and info.version <= before[topic]:
                    return False
            return True

        return done

    def failed(code: ErrorCode, message: str) -> dict[str, Any]:
        return _reassignment_response({k: (code, message) for k in targets})

    return await controller_requests.answer(broker, ctx, body, req.timeout_ms, run_here, settled, failed)


# -- ListPartitionReassignments ------------------------------------------------------------------------------------
async def handle_list_partition_reassignments(broker: BrokerServices, ctx: RequestContext,
                                              body: memoryview) -> bytes:
    req = decode_request(ApiKey.LIST_PARTITION_REASSIGNMENTS, ctx.api_version, body)
    if not ctx.authorized_cluster():
        # ListPartitionReassignmentsRequest.getErrorResponse: the partitions asked about, with nothing in them
        data = {"throttle_time_ms": 0, "error_code": ctx.denial(ResourceType.CLUSTER),
                "error_message": _denied_message(ctx),
                "topics": [{"name": t.name, "partitions": [
                    {"partition_index": p, "replicas": [], "adding_replicas": [], "removing_replicas": []}
                    for p in t.partition_indexes]} for t in req.topics or []]}
        return encode_response(ApiKey.LIST_PARTITION_REASSIGNMENTS, ctx.api_version, data)
    cluster = getattr(broker, "cluster", None)
    topics: dict[str, list[dict[str, Any]]] = {}
    if cluster is not None:
        image = cluster.image
        wanted = None if req.topics is None else {(t.name, p) for t in req.topics for p in t.partition_indexes}
        for topic, p, assignment, _ in image.all_partitions():
            if assignment.reassigning and (wanted is None or (topic, p) in wanted):
                topics.setdefault(topic, []).append({
                    "partition_index": p, "replicas": list(assignment.replicas),
                    "adding_replicas": list(assignment.adding), "removing_replicas": list(assignment.removing)})
    data = {"throttle_time_ms": 0, "error_code": 0, "error_message": None,
            "topics": [{"name": t, "partitions": parts} for t, parts in sorted(topics.items())]}
    return encode_response(ApiKey.LIST_PARTITION_REASSIGNMENTS, ctx.api_version, data)


# -- ControlledShutdown (inter-broker) ------------------------------------------------------------------------------
async def handle_controlled_shutdown(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.CONTROLLED_SHUTDOWN, ctx.api_version, body)
    cluster = getattr(broker, "cluster", None)
    code, remaining = ErrorCode.NOT_CONTROLLER, []
    if not ctx.authorized_cluster():
        code = ctx.denial(ResourceType.CLUSTER)
    elif cluster is not None and cluster.controller is not None:
        result = await cluster.controller.controlled_shutdown(req.broker_id, req.broker_epoch)
        code, remaining = result.code, result.remaining
    data = {"error_code": code, "remaining_partitions": [{"topic_name": t, "partition_index": p}
                                                          for t, p in remaining]}
    return encode_response(ApiKey.CONTROLLED_SHUTDOWN, ctx.api_version, data)
