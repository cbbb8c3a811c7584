"""Which read a watch asks for (cluster/store/loader.py's `watched`), without ZooKeeper: every znode a read watches
is routed to the read that re-reads it, with its arguments; znodes no read watches, and paths of the layout's inner
levels, ask for nothing."""

from __future__ import annotations

import pytest

from oncelog.cluster.store.loader import ImageLoader, watched


@pytest.mark.parametrize("rel, read, args", [
    ("/brokers/ids", ImageLoader.read_brokers, ()),
    ("/brokers/ids/3", ImageLoader.read_broker, (3,)),
    ("/controller", ImageLoader.read_controller, ()),
    ("/topics", ImageLoader.read_topics, ()),
    ("/topics/orders", ImageLoader.read_topic, ("orders",)),
    ("/topics/orders/partitions/12/state", ImageLoader.read_state, ("orders", 12)),
    ("/configs/topics/orders", ImageLoader.read_configs, ("orders",)),
    ("/deleting", ImageLoader.read_deletions, ()),
    ("/deleting/orders", ImageLoader.read_deletion, ("orders",)),
])
def test_a_watched_znode_asks_for_its_read(rel, read, args):
    assert watched(rel) == (read, args)


@pytest.mark.parametrize("rel", [
    "",
    "/brokers",
    "/brokers/ids/not-a-number",
    "/controller_epoch",
    "/cluster_id",
    "/latest_producer_id_block",
    "/topics/orders/partitions",
    "/topics/orders/partitions/12",
    "/topics/orders/partitions/x/state",
    "/configs/topics",
    "/deleting/orders/more",
])
def test_other_znodes_ask_for_nothing(rel):
    assert watched(rel) is None
