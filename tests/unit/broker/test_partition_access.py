"""The leader-epoch fencing rule every partition access applies (KIP-320)."""

from __future__ import annotations

import pytest

from oncelog.broker.partition_access import check_leader_epoch
from oncelog.errors import ErrorCode


@pytest.mark.parametrize("requested,current,expected", [
    (-1, 0, ErrorCode.NONE),  # the request names no epoch
    (-1, 7, ErrorCode.NONE),
    (7, 7, ErrorCode.NONE),
    (6, 7, ErrorCode.FENCED_LEADER_EPOCH),  # the client's metadata is older than the leader's
    (0, 7, ErrorCode.FENCED_LEADER_EPOCH),
    (-2, 0, ErrorCode.FENCED_LEADER_EPOCH),  # only -1 means "none"
    (8, 7, ErrorCode.UNKNOWN_LEADER_EPOCH),  # this broker has not learned of the election yet
    (1, 0, ErrorCode.UNKNOWN_LEADER_EPOCH),
])
def test_check_leader_epoch(requested, current, expected):
    assert check_leader_epoch(requested, current) == expected
