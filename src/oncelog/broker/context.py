"""What a request handler sees: its request's context and the broker's services.

Handlers, the dispatcher and the connection sit below the server that wires them, so
they name the broker and the connection through the Protocols here, never through
`server.Broker` or `connection.Connection`; `server.Broker` and `connection.Connection`
satisfy them structurally. A cluster-mode broker offers the same members.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from ..errors import ErrorCode
from ..security.acls import SUPPORTED_OPERATIONS, AclOperation, ResourceType
from ..security.api_acls import CLUSTER_NAME, check_for, request_name
from ..security.forwarding import forwarded_for, is_forwarded

if TYPE_CHECKING:
    from ..config import BrokerConfig
    from ..coordinator.group import GroupCoordinator
    from ..coordinator.txn.coordinator import TransactionCoordinator
    from ..coordinator.txn.producer_ids import ProducerIdManager
    from ..storage.flusher import GroupCommitFlusher
    from ..storage.log_manager import LogManager
    from .delayed import PartitionWatchers
    from .metrics import BrokerMetrics
    from .partition_access import PartitionAccess
    from .security_layer import BrokerSecurity
    from .txn_verification import TxnVerifier


class ClientConnection(Protocol):
    """The parts of a client connection that the dispatcher and the handlers use."""

    peer: str
    closed: bool
    # Requests after this position on the connection are dropped unprocessed (None: none are).
    close_at: int | None
    # What the client said it is in ApiVersions v3+ (e.g. "apache-kafka-java", "librdkafka").
    client_software: str | None
    # Last fetch offset per partition, so records out are counted once.
    fetch_positions: dict[tuple[str, int], int]
    # The produce request the connection's next ones must append after (None: none is waiting).
    produce_gate: asyncio.Future[None] | None
    # Who is calling ("User:alice"; "User:ANONYMOUS" without TLS client certificates or SASL) and from where.
    principal: str
    client_host: str
    # The listener the client came in on (security_layer.ListenerRuntime; None: a test harness's connection).
    listener: Any
    # The SASL state machine of a SASL listener's connection, None elsewhere.
    authenticator: Any

    def close_after_pending(self, seq: int | None = None) -> None: ...


@dataclass
class RequestContext:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    connection: ClientConnection
    seq: int = 0  # position of the request on its connection
    # security.authorizer.Authorizer when ACLs are on (authorizer.class.name), else None: every check passes
    authorizer: Any = None
    # Set by a handler whose request Kafka answers without a request-quota throttle (a follower's Fetch):
    # broker/request_quota.py
    quota_exempt: bool = False

    @property
    def principal(self) -> str:
        """Who is calling: the connection's principal, or, for an admin request a broker forwarded, the client's
        it was forwarded for (`on_behalf`)."""
        on_behalf = self.on_behalf
        return on_behalf[0] if on_behalf is not None else getattr(self.connection, "principal", "User:ANONYMOUS")

    @property
    def host(self) -> str:
        """Where the caller connected from (for a forwarded request: where its client did)."""
        on_behalf = self.on_behalf
        return on_behalf[1] if on_behalf is not None else self.connection.client_host

    @functools.cached_property
    def from_broker(self) -> bool:
        """Whether this request comes from another broker of the cluster: its client id says so (a forwarded
        request), and, with an authorizer on, its connection's principal may CLUSTER_ACTION on the cluster, so a
        client cannot claim a broker's exemptions (creating an internal topic) by naming itself like one."""
        if not is_forwarded(self.client_id):
            return False
        if self.authorizer is None:
            return True
        sender = getattr(self.connection, "principal", "User:ANONYMOUS")
        return self.authorizer.authorize(sender, self.connection.client_host, AclOperation.CLUSTER_ACTION,
                                         ResourceType.CLUSTER, CLUSTER_NAME, request_name=request_name(self.api_key),
                                         log_if_allowed=False)

    @functools.cached_property
    def on_behalf(self) -> tuple[str, str] | None:
        """(principal, host) of the client a broker forwarded this request for (security/forwarding.py), believed
        only with an authorizer on and from a connection whose own principal may CLUSTER_ACTION on the cluster
        (a broker), as Kafka's controller checks an Envelope's sender; otherwise None."""
        if self.authorizer is None:
            return None
        claimed = forwarded_for(self.client_id)
        if claimed is None:
            return None
        sender = getattr(self.connection, "principal", "User:ANONYMOUS")
        if not self.authorizer.authorize(sender, self.connection.client_host, AclOperation.CLUSTER_ACTION,
                                         ResourceType.CLUSTER, CLUSTER_NAME, request_name=request_name(self.api_key),
                                         log_if_allowed=False):
            return None
        return claimed

    def authorized(self, resource: ResourceType, name: str, operation: AclOperation | None = None, *,
                   log_denied: bool = True) -> bool:
        """May the caller do what this API needs on `resource` `name`? The operation comes from the API's row of
        security/api_acls.RULES (named here only where the row has two on that resource type). `log_denied`
        False: a denial that only decides between two paths (Kafka's logIfDenied = false) is audited at TRACE."""
        if self.authorizer is None:
            return True
        check = check_for(self.api_key, resource, operation)
        return self.authorizer.authorize(self.principal, self.host, check.operation, resource,
                                         name, request_name=request_name(self.api_key), log_if_denied=log_denied)

    def filter_authorized(self, resource: ResourceType, names: Iterable[str],
                          operation: AclOperation | None = None, *, log_denied: bool = True) -> list[str]:
        """The names (in order) the caller may do this API's operation on (Kafka's filterByAuthorized)."""
        names = list(names)
        if self.authorizer is None:
            return names
        check = check_for(self.api_key, resource, operation)
        return self.authorizer.filter(self.principal, self.host, check.operation, resource,
                                      names, request_name=request_name(self.api_key), log_if_denied=log_denied)

    def authorized_any(self, resource: ResourceType, operation: AclOperation | None = None) -> bool:
        """Is there any `resource` the caller may do the operation on (KIP-679: WRITE on some topic)?"""
        if self.authorizer is None:
            return True
        check = check_for(self.api_key, resource, operation)
        return self.authorizer.authorize_any(self.principal, self.host, check.operation, resource,
                                             request_name=request_name(self.api_key))

    def authorized_cluster(self, operation: AclOperation | None = None, *, log_denied: bool = True) -> bool:
        return self.authorized(ResourceType.CLUSTER, CLUSTER_NAME, operation, log_denied=log_denied)

    def authorized_operations(self, resource: ResourceType, name: str) -> set[int]:
        """The operations the caller may do on the resource, for `include_*_authorized_operations` (Kafka's
        AuthHelper.authorizedOperations: every supported operation when no authorizer is on); the codecs write
        the set as Kafka's 32-bit field. Audit lines at TRACE only: asking is not doing."""
        supported = sorted(SUPPORTED_OPERATIONS[resource])
        if self.authorizer is not None:
            supported = [op for op in supported
                         if self.authorizer.authorize(self.principal, self.host, op, resource, name,
                                                      request_name=request_name(self.api_key),
                                                      log_if_allowed=False, log_if_denied=False)]
        return {int(op) for op in supported}

    def denial(self, resource: ResourceType, operation: AclOperation | None = None) -> ErrorCode:
        """The error this API answers when the check on `resource` fails."""
        return check_for(self.api_key, resource, operation).error


class RequestDispatcher(Protocol):
    """Where a connection hands its frames, and what ApiVersions advertises."""

    def dispatch(self, conn: ClientConnection, frame: bytearray, fut: asyncio.Future, seq: int) -> None: ...

    def supported_versions(self, sasl: bool = False) -> list[tuple[int, int, int]]: ...


class CoordinatorNode(NamedTuple):
    """The broker FindCoordinator names: the leader of the key's internal-topic partition."""

    node_id: int
    host: str
    port: int


class BrokerServices(Protocol):
    """What the handlers take from the broker: identity, storage, coordinators, metrics, watchers.

    `partitions` decides which partitions this broker may serve and on what terms (leadership, leader epoch,
    acks=all completion); handlers ask it rather than reading `logs` wherever leadership matters."""

    @property
    def config(self) -> BrokerConfig: ...
    @property
    def data_dir(self) -> Path: ...
    @property
    def node_id(self) -> int: ...
    @property
    def cluster_id(self) -> str: ...
    @property
    def advertised(self) -> tuple[str, int]: ...
    @property
    def security(self) -> BrokerSecurity: ...

    def advertised_for(self, listener: Any) -> tuple[str, int]:
        """host:port of this broker on `listener` (a connection's), as Metadata answers clients of it."""
        ...
    @property
    def logs(self) -> LogManager: ...
    @property
    def partitions(self) -> PartitionAccess: ...
    @property
    def flusher(self) -> GroupCommitFlusher: ...
    @property
    def producer_ids(self) -> ProducerIdManager: ...
    @property
    def txn_coordinator(self) -> TransactionCoordinator | None: ...
    @property
    def group_coordinator(self) -> GroupCoordinator | None: ...
    @property
    def txn_verifier(self) -> TxnVerifier | None:
        """Asks other brokers' transaction coordinators (KIP-890 verification); None on the single node."""
        ...
    @property
    def metrics(self) -> BrokerMetrics: ...
    @property
    def watchers(self) -> PartitionWatchers: ...
    @property
    def dispatcher(self) -> RequestDispatcher: ...
    @property
    def cluster(self) -> Any:
        """Cluster mode (`cluster_mode.ClusterMode`: image, controller, forwarding), None on the single node."""
        ...

    async def init_transactional_producer(self, req: Any, version: int) -> dict[str, Any]: ...

    def coordinator_node(self, topic: str, partition: int, listener: Any = None) -> CoordinatorNode | ErrorCode:
        """The broker whose coordinator serves the keys of internal `topic`-`partition`: its leader as this broker
        sees it (the single node: itself). COORDINATOR_NOT_AVAILABLE while the partition has no leader, or the
        topic does not exist yet and cannot be created with its replication factor (fewer live brokers)."""
        ...


Handler = Callable[[BrokerServices, RequestContext, memoryview], Awaitable[Any]]
