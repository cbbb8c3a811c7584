"""replica.fetch.max.bytes and replica.fetch.response.max.bytes bound what a follower asks for in one fetch (issue
21's audit): a follower added to a partition that holds 20 batches catches up in one or two fetches by default, and
in at least 20 when either bound is below one batch (a fetch still carries one whole batch, as in Kafka). Real
brokers over TCP, the metadata image fed by hand (tests/integration/test_replication.py)."""

from __future__ import annotations

import pytest
from tests.integration.test_replication import T, batch, cluster, produce, wait_for  # noqa: F401 - the fixture


def leader_fetches(c) -> float:
    registry = c.nodes[1].broker.metrics.registry
    return c.call(lambda: registry.get_sample_value("oncelog_requests_total", {"api": "FETCH"}) or 0.0)


@pytest.mark.parametrize(("settings", "fewest", "most"), [
    ({}, 1, 3),
    ({"replica.fetch.max.bytes": 1}, 20, None),
    ({"replica.fetch.response.max.bytes": 1}, 20, None),
])
def test_fetch_bounds_of_a_catching_up_follower(cluster, settings, fewest, most):  # noqa: F811 - the fixture
    c = cluster(nodes=2, settings=settings)
    c.create((1,))
    wait_for(lambda: c.call(lambda: T in c.nodes[1].broker.logs.topics), "the leader's copy")
    for i in range(20):
        assert produce(c.nodes[1], batch([b"%d" % i * 100]), acks=1) == (0, i)
    before = leader_fetches(c)
    c.reassign((1, 2))
    wait_for(lambda: c.call(lambda: T in c.nodes[2].broker.logs.topics
                            and c.nodes[2].log().log_end_offset == 20), "the follower to catch up")
    fetches = leader_fetches(c) - before
    assert fetches >= fewest
    if most is not None:
        assert fetches <= most
