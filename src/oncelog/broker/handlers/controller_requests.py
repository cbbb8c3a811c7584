"""Admin requests in cluster mode: carried out by the controller, answered once this broker's image shows them.

CreateTopics, DeleteTopics, CreatePartitions, IncrementalAlterConfigs (topics), AlterPartitionReassignments and
ElectLeaders change cluster metadata, which only the controller writes (docs/cluster.md §5.2). Their handlers
build the answer with `run_here` when this broker's controller is active; otherwise the request goes, unchanged, to
the controller (ClusterMode.via_controller) on behalf of the client (security/forwarding.py: with ACLs on, the
controller decides it as the client's), and this broker answers with the controller's response once its own
metadata image shows the change (`settled`), so a client's next Metadata request to this broker sees it. A request
no controller took before the deadline is answered REQUEST_TIMED_OUT by `failed`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ...errors import ErrorCode
from ...protocol.messages import encode_response

if TYPE_CHECKING:
    from ..context import BrokerServices, RequestContext

DEFAULT_TIMEOUT_MS = 30000  # requests without a timeout of their own (IncrementalAlterConfigs): Kafka's default


async def answer(
    broker: BrokerServices,
    ctx: RequestContext,
    body: memoryview,
    timeout_ms: int,
    run_here: Callable[[], Awaitable[dict[str, Any]]],
    settled: Callable[[Any], Callable[[], bool]],
    failed: Callable[[ErrorCode, str], dict[str, Any]],
) -> bytes:
    """The response body to an admin request in cluster mode. `settled(decoded response)` gives the condition on
    the image that the controller's answer implies."""
    from ...cluster.inter_broker import ControllerUnavailable

    cluster = broker.cluster
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(timeout_ms if timeout_ms > 0 else DEFAULT_TIMEOUT_MS, 1) / 1000
    try:
        routed = await cluster.via_controller(ctx.api_key, ctx.api_version, body, ctx.client_id, deadline,
                                              run_here, on_behalf=(ctx.principal, ctx.host))
    except ControllerUnavailable as exc:
        return encode_response(ctx.api_key, ctx.api_version,
                               failed(ErrorCode.REQUEST_TIMED_OUT, f"No controller took the request: {exc}"))
    if routed.here is not None:
        return encode_response(ctx.api_key, ctx.api_version, routed.here)
    await cluster.wait_image(settled(routed.decoded), deadline)
    return routed.raw


def in_cluster(broker: BrokerServices) -> bool:
    return getattr(broker, "cluster", None) is not None
