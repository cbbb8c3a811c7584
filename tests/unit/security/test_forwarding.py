"""Whose admin request a broker forwards (security/forwarding.py) and whom the controller decides it as
(broker/context.py's RequestContext.on_behalf): the claim in the client id reads back, and it is believed only with
an authorizer on and from a connection that may CLUSTER_ACTION on the cluster."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from oncelog.broker.context import RequestContext
from oncelog.protocol.apis import ApiKey
from oncelog.security.acls import AclOperation, AclPermissionType, PatternType, ResourceType, acl
from oncelog.security.authorizer import Authorizer
from oncelog.security.forwarding import forwarded_client_id, forwarded_for, is_forwarded


@pytest.mark.parametrize("principal, host", [
    ("User:alice", "10.0.0.7"), ("User:CN=app,O=Example;x", "::1"), ("User:a=b;host=evil", "h%1"),
])
def test_the_client_a_request_is_forwarded_for_reads_back(principal, host):
    client_id = forwarded_client_id(3, (principal, host))
    assert client_id.startswith("oncelog-forwarded-by-3;") and is_forwarded(client_id)
    assert forwarded_for(client_id) == (principal, host)


@pytest.mark.parametrize("client_id", [
    None, "app", "oncelog-forwarded-by-3", "oncelog-forwarded-by-3;host=h", "oncelog-forwarded-by-3;principal=alice;host=h",
    "app;principal=User%3Aadmin;host=h",
])
def test_no_claim(client_id):
    assert forwarded_for(client_id) is None
    assert is_forwarded(forwarded_client_id(1)) and forwarded_for(forwarded_client_id(1)) is None


def context(client_id: str | None, sender: str, authorizer: Authorizer | None) -> RequestContext:
    connection = SimpleNamespace(principal=sender, client_host="10.0.0.2")
    return RequestContext(ApiKey.CREATE_TOPICS, 7, 1, client_id, connection, 0, authorizer)  # type: ignore[arg-type]


def test_the_claim_is_believed_only_from_a_connection_that_may_cluster_action():
    authorizer = Authorizer(super_users=["User:broker"])
    authorizer.update([acl(ResourceType.CLUSTER, "kafka-cluster", PatternType.LITERAL, "User:other-broker", "*",
                           AclOperation.CLUSTER_ACTION, AclPermissionType.ALLOW)])
    claim = forwarded_client_id(2, ("User:alice", "10.0.0.9"))
    for sender in ("User:broker", "User:other-broker"):
        ctx = context(claim, sender, authorizer)
        assert (ctx.principal, ctx.host) == ("User:alice", "10.0.0.9")
        assert not ctx.authorized_cluster(AclOperation.CREATE, log_denied=False)   # decided as alice's
    posing = context(forwarded_client_id(2, ("User:broker", "10.0.0.9")), "User:mallory", authorizer)
    assert (posing.principal, posing.host) == ("User:mallory", "10.0.0.2")
    unsecured = context(claim, "User:ANONYMOUS", None)          # no authorizer: nothing to decide, no claim taken
    assert unsecured.principal == "User:ANONYMOUS" and unsecured.on_behalf is None
    plain = context("app", "User:bob", authorizer)
    assert (plain.principal, plain.host) == ("User:bob", "10.0.0.2")
