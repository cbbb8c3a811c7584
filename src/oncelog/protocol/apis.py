"""The API key table: names, the version ranges oncelog implements, and header flexibility.

ApiVersions is built from this table filtered by the handlers the broker actually
registered, so an API is never advertised without a real implementation behind it.
Ranges stay inside what the pinned kafka-python schemas can decode, and start at
Kafka 4.0's minimums (KIP-896) where every target client still overlaps.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class ApiKey(IntEnum):
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    CONTROLLED_SHUTDOWN = 7  # inter-broker only: accepted, never advertised (broker/dispatch.py)
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    WRITE_TXN_MARKERS = 27
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_ACLS = 29
    CREATE_ACLS = 30
    DELETE_ACLS = 31
    DESCRIBE_CONFIGS = 32
    ALTER_REPLICA_LOG_DIRS = 34
    DESCRIBE_LOG_DIRS = 35
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    INCREMENTAL_ALTER_CONFIGS = 44
    ELECT_LEADERS = 43
    ALTER_PARTITION_REASSIGNMENTS = 45
    LIST_PARTITION_REASSIGNMENTS = 46
    OFFSET_DELETE = 47
    DESCRIBE_CLIENT_QUOTAS = 48
    ALTER_CLIENT_QUOTAS = 49
    DESCRIBE_USER_SCRAM_CREDENTIALS = 50
    ALTER_USER_SCRAM_CREDENTIALS = 51
    FETCH_SNAPSHOT = 59  # inter-broker only: a follower takes its leader's producer state (docs/cluster.md §4.7)
    DESCRIBE_CLUSTER = 60
    DESCRIBE_PRODUCERS = 61
    DESCRIBE_TRANSACTIONS = 65
    LIST_TRANSACTIONS = 66


@dataclass(frozen=True)
class ApiSpec:
    key: ApiKey
    min_version: int
    max_version: int
    # First version whose request uses header v2 and compact encodings (-1: never).
    flexible_from: int

    def flexible(self, version: int) -> bool:
        return 0 <= self.flexible_from <= version


SPECS: dict[int, ApiSpec] = {
    s.key: s
    for s in [
        ApiSpec(ApiKey.PRODUCE, 3, 11, 9),
        ApiSpec(ApiKey.FETCH, 4, 12, 12),
        ApiSpec(ApiKey.LIST_OFFSETS, 1, 7, 6),
        ApiSpec(ApiKey.METADATA, 0, 12, 9),
        ApiSpec(ApiKey.CONTROLLED_SHUTDOWN, 3, 3, 3),
        ApiSpec(ApiKey.OFFSET_COMMIT, 2, 9, 8),
        ApiSpec(ApiKey.OFFSET_FETCH, 1, 9, 6),
        ApiSpec(ApiKey.FIND_COORDINATOR, 0, 6, 3),
        ApiSpec(ApiKey.JOIN_GROUP, 0, 9, 6),
        ApiSpec(ApiKey.HEARTBEAT, 0, 4, 4),
        ApiSpec(ApiKey.LEAVE_GROUP, 0, 5, 4),
        ApiSpec(ApiKey.SYNC_GROUP, 0, 5, 4),
        ApiSpec(ApiKey.DESCRIBE_GROUPS, 0, 5, 5),
        ApiSpec(ApiKey.LIST_GROUPS, 0, 4, 3),
        # v1 only: v0 means raw token frames after the handshake, which only Kerberos clients still send
        ApiSpec(ApiKey.SASL_HANDSHAKE, 1, 1, -1),
        ApiSpec(ApiKey.API_VERSIONS, 0, 4, 3),
        ApiSpec(ApiKey.CREATE_TOPICS, 2, 7, 5),
        ApiSpec(ApiKey.DELETE_TOPICS, 1, 6, 4),
        ApiSpec(ApiKey.DELETE_RECORDS, 0, 2, 2),
        ApiSpec(ApiKey.INIT_PRODUCER_ID, 0, 5, 2),
        ApiSpec(ApiKey.OFFSET_FOR_LEADER_EPOCH, 2, 4, 4),
        ApiSpec(ApiKey.ADD_PARTITIONS_TO_TXN, 0, 4, 3),
        ApiSpec(ApiKey.ADD_OFFSETS_TO_TXN, 0, 4, 3),
        ApiSpec(ApiKey.END_TXN, 0, 4, 3),
        ApiSpec(ApiKey.WRITE_TXN_MARKERS, 1, 1, 1),
        ApiSpec(ApiKey.TXN_OFFSET_COMMIT, 0, 4, 3),
        ApiSpec(ApiKey.DESCRIBE_ACLS, 1, 3, 2),
        ApiSpec(ApiKey.CREATE_ACLS, 1, 3, 2),
        ApiSpec(ApiKey.DELETE_ACLS, 1, 3, 2),
        ApiSpec(ApiKey.DESCRIBE_CONFIGS, 1, 4, 4),
        ApiSpec(ApiKey.ALTER_REPLICA_LOG_DIRS, 1, 2, 2),
        ApiSpec(ApiKey.DESCRIBE_LOG_DIRS, 1, 4, 2),
        ApiSpec(ApiKey.SASL_AUTHENTICATE, 0, 2, 2),
        ApiSpec(ApiKey.CREATE_PARTITIONS, 0, 3, 2),
        ApiSpec(ApiKey.DELETE_GROUPS, 0, 2, 2),
        ApiSpec(ApiKey.ELECT_LEADERS, 0, 2, 2),
        ApiSpec(ApiKey.INCREMENTAL_ALTER_CONFIGS, 0, 1, 1),
        ApiSpec(ApiKey.ALTER_PARTITION_REASSIGNMENTS, 0, 1, 0),
        ApiSpec(ApiKey.LIST_PARTITION_REASSIGNMENTS, 0, 0, 0),
        ApiSpec(ApiKey.OFFSET_DELETE, 0, 0, -1),
        ApiSpec(ApiKey.DESCRIBE_CLIENT_QUOTAS, 0, 1, 1),
        ApiSpec(ApiKey.ALTER_CLIENT_QUOTAS, 0, 1, 1),
        ApiSpec(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, 0, 0),
        ApiSpec(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, 0, 0, 0),
        ApiSpec(ApiKey.FETCH_SNAPSHOT, 0, 0, 0),
        ApiSpec(ApiKey.DESCRIBE_CLUSTER, 0, 1, 0),
        ApiSpec(ApiKey.DESCRIBE_PRODUCERS, 0, 0, 0),
        ApiSpec(ApiKey.DESCRIBE_TRANSACTIONS, 0, 0, 0),
        ApiSpec(ApiKey.LIST_TRANSACTIONS, 0, 1, 0),
    ]
}


def request_header_flexible(api_key: int, api_version: int) -> bool:
    """Whether the request header is v2 (tagged fields) for this key and version.

    ApiVersions is special only on the response side (always header v0); its
    request header follows the usual rule.
    """
    spec = SPECS.get(api_key)
    return spec is not None and spec.flexible(api_version)


def response_header_flexible(api_key: int, api_version: int) -> bool:
    if api_key == ApiKey.API_VERSIONS:
        return False
    return request_header_flexible(api_key, api_version)
