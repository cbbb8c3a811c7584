"""ClusterProducerIds: ids from reserved blocks, the next block fetched before the current one runs out."""

from __future__ import annotations

import asyncio

import pytest

from oncelog.cluster.producer_ids import ClusterProducerIds
from oncelog.errors import ErrorCode, KafkaError


def test_ids_come_from_reserved_blocks_in_order_and_never_twice():
    async def body():
        reserved = []
        end = 0

        async def allocate(size):
            nonlocal end
            block = (end + 5, end + 5 + size)  # another broker took the ids in between
            end = block[1]
            reserved.append(block)
            return block

        ids = ClusterProducerIds(allocate, block_size=10)
        await ids.start()
        got = []
        for _ in range(25):
            got.append(ids.next_id())
            await asyncio.sleep(0)  # the background refill runs
        assert got == sorted(set(got))
        assert all(any(s <= pid < e for s, e in reserved) for pid in got)
        assert got[:10] == list(range(5, 15)) and got[10] == 20
        await ids.stop()

    asyncio.run(body())


def test_no_block_at_hand_is_a_retriable_answer():
    async def body():
        calls = 0

        async def allocate(size):
            nonlocal calls
            calls += 1
            if calls > 1:
                raise ConnectionError("coordination service unreachable")
            return (0, size)

        ids = ClusterProducerIds(allocate, block_size=2)
        await ids.start()
        assert [ids.next_id(), ids.next_id()] == [0, 1]
        with pytest.raises(KafkaError) as err:
            ids.next_id()
        assert err.value.code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        await ids.stop()

    asyncio.run(body())
