"""THE table: for every API the broker serves, the ACL checks Kafka makes for it (the "Operations and Resources
on Protocols" table of Kafka's authorization docs, checked against `KafkaApis`).

Handlers never name an operation. They call `ctx.authorized(resource_type, name)` (or `ctx.filter_authorized`,
`ctx.authorized_any`), and the operation and the error to answer come from this table's row for the request's
API key; a row with two checks on one resource type (Metadata: DESCRIBE and CREATE on a topic) is disambiguated
by naming the operation, which must be in the row. An API without a row is refused by the dispatcher when an
authorizer is on (fail closed), and a unit test fails if any served API lacks one.

Scopes say where a failed check shows: REQUEST (the whole answer carries the error), ITEM (each resource named
gets it), FILTER (unauthorized resources are left out of the answer, as if they did not exist).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from functools import cache

from ..errors import ErrorCode
from ..protocol.apis import ApiKey
from .acls import AclOperation, ResourceType

CLUSTER_NAME = "kafka-cluster"

T, G, C, X = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER, ResourceType.TRANSACTIONAL_ID
Op = AclOperation
E = ErrorCode


class Scope(Enum):
    REQUEST = "request"
    ITEM = "item"
    FILTER = "filter"


@dataclass(frozen=True)
class Check:
    resource: ResourceType
    operation: AclOperation
    error: ErrorCode
    scope: Scope
    when: str = ""  # the condition under which Kafka makes the check, when not always


def _c(resource: ResourceType, operation: AclOperation, scope: Scope = Scope.ITEM, when: str = "") -> Check:
    error = {T: E.TOPIC_AUTHORIZATION_FAILED, G: E.GROUP_AUTHORIZATION_FAILED,
             C: E.CLUSTER_AUTHORIZATION_FAILED, X: E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED}[resource]
    return Check(resource, operation, error, scope, when)


R, ITEM, F = Scope.REQUEST, Scope.ITEM, Scope.FILTER

RULES: dict[int, tuple[Check, ...]] = {
    # no check: they come before authentication, or are it
    ApiKey.API_VERSIONS: (),
    ApiKey.SASL_HANDSHAKE: (),
    ApiKey.SASL_AUTHENTICATE: (),
    # data
    ApiKey.PRODUCE: (_c(X, Op.WRITE, R, "transactional"), _c(T, Op.WRITE)),
    ApiKey.FETCH: (_c(C, Op.CLUSTER_ACTION, ITEM, "from a follower (replica_id >= 0)"), _c(T, Op.READ)),
    ApiKey.LIST_OFFSETS: (_c(T, Op.DESCRIBE),),
    ApiKey.METADATA: (_c(T, Op.DESCRIBE, F, "all topics; named topics answer the error"),
                      _c(C, Op.CREATE, ITEM, "auto-creation, else CREATE on each topic"), _c(T, Op.CREATE),
                      _c(C, Op.DESCRIBE, ITEM, "only for include_cluster_authorized_operations")),
    ApiKey.OFFSET_FOR_LEADER_EPOCH: (_c(C, Op.CLUSTER_ACTION, ITEM, "first, unlogged; covers every topic"),
                                     _c(T, Op.DESCRIBE, ITEM, "without CLUSTER_ACTION")),
    ApiKey.DELETE_RECORDS: (_c(T, Op.DELETE),),
    # groups and offsets
    ApiKey.FIND_COORDINATOR: (_c(G, Op.DESCRIBE), _c(X, Op.DESCRIBE)),
    ApiKey.JOIN_GROUP: (_c(G, Op.READ, R),),
    ApiKey.SYNC_GROUP: (_c(G, Op.READ, R),),
    ApiKey.HEARTBEAT: (_c(G, Op.READ, R),),
    ApiKey.LEAVE_GROUP: (_c(G, Op.READ, R),),
    ApiKey.DESCRIBE_GROUPS: (_c(G, Op.DESCRIBE),),
    ApiKey.LIST_GROUPS: (_c(C, Op.DESCRIBE, R, "else each group filtered by DESCRIBE"), _c(G, Op.DESCRIBE, F)),
    ApiKey.DELETE_GROUPS: (_c(G, Op.DELETE),),
    ApiKey.OFFSET_COMMIT: (_c(G, Op.READ, R), _c(T, Op.READ)),
    ApiKey.OFFSET_FETCH: (_c(G, Op.DESCRIBE, R, "per group from v8"), _c(T, Op.DESCRIBE, ITEM, "all partitions: FILTER")),
    ApiKey.OFFSET_DELETE: (_c(G, Op.DELETE, R), _c(T, Op.READ)),
    # transactions and producers
    ApiKey.INIT_PRODUCER_ID: (_c(X, Op.WRITE, R, "transactional"),
                              _c(C, Op.IDEMPOTENT_WRITE, R, "idempotent: or WRITE on any topic (KIP-679)"),
                              _c(T, Op.WRITE, R, "idempotent, any topic")),
    ApiKey.ADD_PARTITIONS_TO_TXN: (_c(X, Op.WRITE, R, "v0-3"), _c(T, Op.WRITE, ITEM, "v0-3; internal topics never"),
                                   _c(C, Op.CLUSTER_ACTION, R, "v4+: only brokers send those")),
    ApiKey.ADD_OFFSETS_TO_TXN: (_c(X, Op.WRITE, R), _c(G, Op.READ, R)),
    ApiKey.END_TXN: (_c(X, Op.WRITE, R),),
    ApiKey.TXN_OFFSET_COMMIT: (_c(X, Op.WRITE, R), _c(G, Op.READ, R), _c(T, Op.READ)),
    ApiKey.WRITE_TXN_MARKERS: (_c(C, Op.ALTER, R, "first, its denial unlogged (kafka-transactions abort)"),
                               _c(C, Op.CLUSTER_ACTION, R, "when ALTER is denied")),
    ApiKey.DESCRIBE_TRANSACTIONS: (_c(X, Op.DESCRIBE), _c(T, Op.DESCRIBE, F)),
    ApiKey.LIST_TRANSACTIONS: (_c(X, Op.DESCRIBE, F),),
    ApiKey.DESCRIBE_PRODUCERS: (_c(T, Op.READ),),
    # topics and configs
    ApiKey.CREATE_TOPICS: (_c(C, Op.CREATE, ITEM, "first, unlogged; else CREATE on each topic"), _c(T, Op.CREATE),
                           _c(T, Op.DESCRIBE_CONFIGS, ITEM, "to return the configs")),
    ApiKey.DELETE_TOPICS: (_c(C, Op.DELETE, ITEM, "first, unlogged; covers every topic"), _c(T, Op.DESCRIBE),
                           _c(T, Op.DELETE)),
    ApiKey.CREATE_PARTITIONS: (_c(T, Op.ALTER),),
    ApiKey.DESCRIBE_CONFIGS: (_c(T, Op.DESCRIBE_CONFIGS), _c(C, Op.DESCRIBE_CONFIGS, ITEM, "broker resources")),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: (_c(T, Op.ALTER_CONFIGS), _c(C, Op.ALTER_CONFIGS, ITEM, "broker resources")),
    # cluster administration
    ApiKey.DESCRIBE_CLUSTER: (_c(C, Op.DESCRIBE, ITEM, "only for include_cluster_authorized_operations"),),
    ApiKey.DESCRIBE_LOG_DIRS: (_c(C, Op.DESCRIBE, R),),
    ApiKey.ALTER_REPLICA_LOG_DIRS: (_c(C, Op.ALTER, R),),
    ApiKey.ELECT_LEADERS: (_c(C, Op.ALTER, R),),
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: (_c(C, Op.ALTER, R),),
    ApiKey.LIST_PARTITION_REASSIGNMENTS: (_c(C, Op.DESCRIBE, R),),
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: (_c(C, Op.DESCRIBE, R),),
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: (_c(C, Op.ALTER, R),),
    ApiKey.DESCRIBE_ACLS: (_c(C, Op.DESCRIBE, R),),
    ApiKey.CREATE_ACLS: (_c(C, Op.ALTER, R),),
    ApiKey.DELETE_ACLS: (_c(C, Op.ALTER, R),),
    ApiKey.DESCRIBE_CLIENT_QUOTAS: (_c(C, Op.DESCRIBE_CONFIGS, R),),
    ApiKey.ALTER_CLIENT_QUOTAS: (_c(C, Op.ALTER_CONFIGS, R),),
    # between brokers
    ApiKey.CONTROLLED_SHUTDOWN: (_c(C, Op.CLUSTER_ACTION, R),),
    ApiKey.FETCH_SNAPSHOT: (_c(C, Op.CLUSTER_ACTION, R),),
}


def check_for(api_key: int, resource: ResourceType, operation: AclOperation | None = None) -> Check:
    """The row's check on `resource` (and `operation`, when the row has more than one on that type)."""
    matches = [c for c in RULES[api_key] if c.resource == resource and (operation is None or c.operation == operation)]
    if len(matches) != 1:
        raise LookupError(f"{ApiKey(api_key).name}: {len(matches)} checks on {resource.name} "
                          f"{operation.name if operation else ''} in security/api_acls.RULES")
    return matches[0]


@cache
def request_name(api_key: int) -> str:
    """The API's name as Kafka's authorizer log writes it (ApiKeys.name: "Produce", "OffsetCommit")."""
    return "".join(part.capitalize() for part in ApiKey(api_key).name.split("_"))
