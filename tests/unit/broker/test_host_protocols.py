"""The Protocols that let handlers, the connection and the coordinators name the broker without importing
`broker.server` are satisfied by the real objects: a started in-process broker (storage, coordinators and
all, no client connected) has every member each Protocol declares, and so do the objects behind them.
Nothing checks these Protocols at run time otherwise, so a renamed member would fail only on the request
path that uses it."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path

from oncelog.broker.cluster_mode import ClusterHost
from oncelog.broker.connection import Connection, ConnectionHost
from oncelog.broker.context import BrokerServices, ClientConnection, RequestDispatcher
from oncelog.broker.partition_access import PartitionAccess
from oncelog.broker.server import Broker
from oncelog.config import load_broker_config
from oncelog.coordinator.host import (
    GroupHost,
    MetricsRegistry,
    PartitionLeadership,
    ProducerIdSource,
    TransactionalIds,
    TransactionHost,
    TxnOffsetsSink,
)


def declared(protocol: type) -> set[str]:
    """The members a Protocol declares: its methods and properties, and its annotated attributes."""
    names = {n for n in vars(protocol) if not n.startswith("_")}
    return names | set(getattr(protocol, "__annotations__", {}))


def missing(obj: object, protocol: type) -> set[str]:
    # getattr_static: a property is found without being run.
    absent = set()
    for name in declared(protocol):
        try:
            inspect.getattr_static(obj, name)
        except AttributeError:
            absent.add(name)
    return absent


def test_declared_sees_properties_methods_and_attributes() -> None:
    assert {"config", "dispatcher", "register_connection", "unregister_connection"} <= declared(ConnectionHost)
    assert {"peer", "closed", "close_at", "close_after_pending"} <= declared(ClientConnection)


def test_a_started_broker_satisfies_every_host_protocol(tmp_path: Path) -> None:
    async def main() -> None:
        config = load_broker_config(overrides=["oncelog.fsync.enable=false"])
        broker = Broker(config, tmp_path / "data", port=0)
        await broker.start()
        try:
            for protocol in (BrokerServices, ConnectionHost, TransactionHost, GroupHost, ClusterHost):
                assert missing(broker, protocol) == set(), protocol.__name__
            assert missing(broker.dispatcher, RequestDispatcher) == set()
            assert missing(broker.partitions, PartitionAccess) == set()
            assert missing(broker.producer_ids, ProducerIdSource) == set()
            assert missing(broker.metrics, MetricsRegistry) == set()
            assert broker.txn_coordinator is not None and broker.group_coordinator is not None
            assert missing(broker.txn_coordinator, TransactionalIds) == set()
            assert missing(broker.group_coordinator, TxnOffsetsSink) == set()
            assert missing(broker.group_coordinator, PartitionLeadership) == set()
            assert missing(broker.txn_coordinator, PartitionLeadership) == set()
            assert missing(Connection(broker), ClientConnection) == set()
            assert isinstance(broker.cluster_id, str) and broker.advertised[1] == broker.port
        finally:
            await broker.stop()

    asyncio.run(main())
