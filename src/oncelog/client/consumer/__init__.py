"""The consumer: fetcher, group membership, offsets, and the Consumer / AsyncConsumer facades."""

from __future__ import annotations

from .consumer import AsyncConsumer, Consumer
from .fetcher import OffsetResetError, PartitionEOF
from .offsets import CommitFailed

__all__ = ["Consumer", "AsyncConsumer", "PartitionEOF", "OffsetResetError", "CommitFailed"]
