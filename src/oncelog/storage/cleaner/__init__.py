"""The log cleaner (compaction) beside the log: docs/log-cleaner.md is its design and the list of its rules.

Built so far: the offset map (`offset_map`) and the per-batch rules of a clean (`batch_filter`), pure and tested
on built batches. Not yet wired to any log: segments, the swap, the manager and the worker processes come next
(issue 22), so `cleanup.policy=compact` still keeps every record.
"""
