"""Consumer groups (the classic protocol) and committed offsets in `__consumer_offsets`."""

from .coordinator import GroupCoordinator
from .settings import GroupSettings
from .store import OFFSETS_TOPIC

__all__ = ["OFFSETS_TOPIC", "GroupCoordinator", "GroupSettings"]
