"""A cluster's client quotas in ZooKeeper, shared by every broker: `ZkQuotaStore`, the `QuotaStore` of
security/quotas.py over the config entities of users and client ids (store/entity_configs.py), as Kafka's
ZooKeeper era kept them: /config/users/<user>, /config/users/<user>/clients/<client-id>,
/config/clients/<client-id> (`<default>` for a default), each quota a key of the entity's config,
{"producer_byte_rate": "1048576"}.

`load` and `describe` answer from memory; `alter` is a coroutine that writes every changed entity (one multi-op,
with their change notifications) and returns once this broker holds the change. The listener (the broker's quota
managers) gets every quota after each change, this broker's own or one a notification brought.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ...security.quotas import (
    USER_CLIENT_KEYS,
    Change,
    QuotaEntity,
    QuotaFilter,
    QuotaListener,
    Quotas,
    validate_value,
)
from . import znodes
from .entity_configs import Config, EntityConfigs

log = logging.getLogger(__name__)


def quotas_of(path: str, config: Config) -> dict[str, float]:
    """The quota keys among an entity's config (a value that is not a number AlterClientQuotas would take is left
    out, logged)."""
    out = {}
    for key in USER_CLIENT_KEYS:
        text = config.get(key)
        if text is None:
            continue
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        problem = validate_value(USER_CLIENT_KEYS, key, value)
        if problem is not None:
            log.warning("ignoring the quota %s=%s of %s: %s", key, text, path, problem.message)
            continue
        out[key] = value
    return out


class ZkQuotaStore:
    """Client quotas in the config entities of users and client ids (see the module docstring)."""

    def __init__(self, configs: EntityConfigs, listener: QuotaListener | None = None) -> None:
        self.configs = configs
        self._listener = listener
        self._quotas: Quotas = {}
        configs.subscribe(self._changed)
        self._changed(set(configs.configs))

    def set_listener(self, listener: QuotaListener | None) -> None:
        self._listener = listener

    def _changed(self, paths: set[str]) -> None:
        moved = False
        for path in paths:
            try:
                entity = znodes.quota_entity_of(path)
            except ValueError:
                continue
            values = quotas_of(path, self.configs.configs.get(path, {}))
            if values != self._quotas.get(entity, {}):
                moved = True
                if values:
                    self._quotas[entity] = values
                else:
                    self._quotas.pop(entity, None)
        if moved and self._listener is not None:
            self._listener(self.load())

    def load(self) -> Quotas:
        return {entity: dict(values) for entity, values in self._quotas.items()}

    def describe(self, quota_filter: QuotaFilter) -> list[tuple[QuotaEntity, dict[str, float]]]:
        return [(entity, dict(values)) for entity, values in self._quotas.items() if quota_filter.matches(entity)]

    async def alter(self, changes: Sequence[Change]) -> None:
        """Store validated changes (security/quotas.validate_alterations), every entity in one multi-op; NotStored
        (an OSError) when they could not be stored: nothing changed."""
        if not changes:
            return
        by_path: dict[str, list[tuple[str, float | None]]] = {}
        for entity, key, value in changes:
            by_path.setdefault(znodes.quota_entity_path(entity), []).append((key, value))

        def edit(ops: list[tuple[str, float | None]]):
            def apply(config: Config) -> Config:
                for key, value in ops:
                    if value is None:
                        config.pop(key, None)
                    else:
                        config[key] = znodes.quota_text(key, value)
                return config
            return apply

        await self.configs.alter({path: edit(ops) for path, ops in by_path.items()}, "client quotas")
        for entity, key, value in changes:
            log.info("%s quota %s of %s", "Removed" if value is None else f"Set to {value}", key, entity.path)
