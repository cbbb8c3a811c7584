"""One module per API family; HANDLERS maps API keys to the coroutine that serves them.

Only APIs listed in HANDLERS are advertised in ApiVersions; INTERNAL_HANDLERS serve requests between brokers
(never advertised).
"""

from __future__ import annotations

from ...protocol.apis import ApiKey
from . import (
    acls,
    api_versions,
    cluster,
    configs,
    fetch,
    fetch_snapshot,
    groups,
    leader_epochs,
    leadership,
    list_offsets,
    metadata,
    offsets,
    produce,
    producers,
    quotas,
    records,
    sasl,
    scram,
    topics,
    transactions,
)

HANDLERS = {
    ApiKey.API_VERSIONS: api_versions.handle,
    ApiKey.METADATA: metadata.handle,
    ApiKey.PRODUCE: produce.handle,
    ApiKey.FETCH: fetch.handle,
    ApiKey.LIST_OFFSETS: list_offsets.handle,
    ApiKey.OFFSET_FOR_LEADER_EPOCH: leader_epochs.handle_offsets_for_leader_epoch,
    ApiKey.CREATE_TOPICS: topics.handle_create_topics,
    ApiKey.DELETE_TOPICS: topics.handle_delete_topics,
    ApiKey.CREATE_PARTITIONS: topics.handle_create_partitions,
    ApiKey.DELETE_RECORDS: records.handle_delete_records,
    ApiKey.DESCRIBE_CONFIGS: configs.handle_describe_configs,
    ApiKey.INCREMENTAL_ALTER_CONFIGS: configs.handle_incremental_alter_configs,
    ApiKey.DESCRIBE_CLUSTER: cluster.handle_describe_cluster,
    ApiKey.DESCRIBE_LOG_DIRS: cluster.handle_describe_log_dirs,
    ApiKey.ALTER_REPLICA_LOG_DIRS: cluster.handle_alter_replica_log_dirs,
    ApiKey.INIT_PRODUCER_ID: producers.handle_init_producer_id,
    ApiKey.DESCRIBE_PRODUCERS: producers.handle_describe_producers,
    ApiKey.ADD_PARTITIONS_TO_TXN: transactions.handle_add_partitions,
    ApiKey.ADD_OFFSETS_TO_TXN: transactions.handle_add_offsets,
    ApiKey.END_TXN: transactions.handle_end_txn,
    ApiKey.TXN_OFFSET_COMMIT: transactions.handle_txn_offset_commit,
    ApiKey.WRITE_TXN_MARKERS: transactions.handle_write_txn_markers,
    ApiKey.DESCRIBE_TRANSACTIONS: transactions.handle_describe_transactions,
    ApiKey.LIST_TRANSACTIONS: transactions.handle_list_transactions,
    ApiKey.FIND_COORDINATOR: groups.handle_find_coordinator,
    ApiKey.JOIN_GROUP: groups.handle_join_group,
    ApiKey.SYNC_GROUP: groups.handle_sync_group,
    ApiKey.HEARTBEAT: groups.handle_heartbeat,
    ApiKey.LEAVE_GROUP: groups.handle_leave_group,
    ApiKey.DESCRIBE_GROUPS: groups.handle_describe_groups,
    ApiKey.LIST_GROUPS: groups.handle_list_groups,
    ApiKey.DELETE_GROUPS: groups.handle_delete_groups,
    ApiKey.OFFSET_COMMIT: offsets.handle_offset_commit,
    ApiKey.OFFSET_FETCH: offsets.handle_offset_fetch,
    ApiKey.OFFSET_DELETE: offsets.handle_offset_delete,
    ApiKey.ELECT_LEADERS: leadership.handle_elect_leaders,
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: leadership.handle_alter_partition_reassignments,
    ApiKey.LIST_PARTITION_REASSIGNMENTS: leadership.handle_list_partition_reassignments,
    ApiKey.SASL_HANDSHAKE: sasl.handle_sasl_handshake,
    ApiKey.SASL_AUTHENTICATE: sasl.handle_sasl_authenticate,
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: scram.handle_describe,
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: scram.handle_alter,
    ApiKey.DESCRIBE_ACLS: acls.handle_describe_acls,
    ApiKey.CREATE_ACLS: acls.handle_create_acls,
    ApiKey.DELETE_ACLS: acls.handle_delete_acls,
    ApiKey.DESCRIBE_CLIENT_QUOTAS: quotas.handle_describe,
    ApiKey.ALTER_CLIENT_QUOTAS: quotas.handle_alter,
}

INTERNAL_HANDLERS = {
    ApiKey.CONTROLLED_SHUTDOWN: leadership.handle_controlled_shutdown,
    ApiKey.FETCH_SNAPSHOT: fetch_snapshot.handle,
}
