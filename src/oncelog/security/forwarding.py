"""Whose admin request a broker forwards to the controller (Kafka's Envelope, KIP-590, in oncelog's own form).

A broker that is not the controller sends CreateTopics, DeleteTopics, CreatePartitions, IncrementalAlterConfigs
(and the other metadata changes) on to the controller, which carries them out. With ACLs on, the controller must
decide them as the client that sent them, not as the forwarding broker (a super user, or one holding
CLUSTER_ACTION): the forwarded request's client id names the client's principal and address,

    oncelog-forwarded-by-<node id>;principal=<url-encoded principal>;host=<url-encoded address>

and the controller believes that claim only from a connection whose own principal may CLUSTER_ACTION on the
cluster, as Kafka's controller checks an Envelope's sender (broker/context.py). From anyone else the claim is
ignored and the request is decided as its sender's own. Pure: no broker or cluster import.
"""

from __future__ import annotations

import urllib.parse

FORWARDED_CLIENT_ID_PREFIX = "oncelog-forwarded-by-"


def is_forwarded(client_id: str | None) -> bool:
    """Whether a request came from another broker forwarding it (it is then never forwarded again)."""
    return client_id is not None and client_id.startswith(FORWARDED_CLIENT_ID_PREFIX)


def forwarded_client_id(node_id: int, on_behalf: tuple[str, str] | None = None) -> str:
    """The client id of a request broker `node_id` forwards for (principal, host), or on its own behalf."""
    text = f"{FORWARDED_CLIENT_ID_PREFIX}{node_id}"
    if on_behalf is not None:
        principal, host = on_behalf
        text += f";principal={urllib.parse.quote(principal, safe='')};host={urllib.parse.quote(host, safe='')}"
    return text


def forwarded_for(client_id: str | None) -> tuple[str, str] | None:
    """(principal, host) a forwarded request's client id names; None when it names none (or is not one)."""
    if not is_forwarded(client_id):
        return None
    assert client_id is not None
    fields = dict(part.partition("=")[::2] for part in client_id.split(";")[1:])
    principal, host = fields.get("principal"), fields.get("host")
    if not principal or host is None:
        return None
    principal = urllib.parse.unquote(principal)
    return (principal, urllib.parse.unquote(host)) if ":" in principal else None
