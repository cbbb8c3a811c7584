"""A batch acknowledged without an offset (DUPLICATE_SEQUENCE_NUMBER) is reported by librdkafka as -1, 0, 1, ...
(its base -1 plus each message's index); the history records no offset for any of them (pure logic)."""

from __future__ import annotations

from tests.faults.workers import AckedOffsets


class Msg:
    def __init__(self, offset):
        self._offset = offset

    def offset(self):
        return self._offset


def test_the_numbering_of_a_batch_without_offset_is_no_offset():
    acked = AckedOffsets()
    seen = [acked.fields(p, Msg(o)) for p, o in [(2, 719), (2, -1), (1, 40), (2, 0), (2, 1), (2, 722), (2, 723)]]
    assert seen == [{"offset": 719}, {"offset": -1}, {"offset": 40}, {"offset": -1, "reported": 0},
                    {"offset": -1, "reported": 1}, {"offset": 722}, {"offset": 723}]


def test_a_real_offset_zero_is_kept_and_none_is_no_offset():
    acked = AckedOffsets()
    assert acked.fields(0, Msg(0)) == {"offset": 0}
    assert acked.fields(0, Msg(None)) == {"offset": -1}
    assert acked.fields(0, Msg(5)) == {"offset": 5}
