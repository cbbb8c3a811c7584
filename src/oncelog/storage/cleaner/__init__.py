"""The log cleaner (compaction) beside the log: docs/log-cleaner.md is its design and the list of its rules.

`offset_map` and `batch_filter` hold the rules (pure), `segment_cleaner` one round on files (in a worker
process), `manager` the choice, the rounds and the checkpoint. The swap that puts a round's segments in place is
the log's (`storage/segment_swap.py`). In a cluster every replica cleans its own copy, below its high watermark.
"""
