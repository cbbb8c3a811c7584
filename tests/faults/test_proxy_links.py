"""The fault proxy tells other brokers' connections from clients' (by the client id of the first request) and
strikes only the links it is told to: a real broker behind it, requests over TCP."""

from __future__ import annotations

import time

import pytest
from kafka.protocol.metadata import ApiVersionsRequest

from tests.faults.proxy import FaultProxy
from tests.support.wire import Wire

REPLICA_OF_2 = "oncelog-replica-2"  # what broker 2's replica fetcher sends (cluster/replica_fetcher.py)
FORWARDED_BY_3 = "oncelog-forwarded-by-3"  # what broker 3 sends the controller (cluster/inter_broker.py)


def api_versions(w: Wire) -> int:
    return w.request(ApiVersionsRequest[0](), 0).error_code


@pytest.fixture
def proxy(module_broker):
    p = FaultProxy(upstream_port=module_broker.port).start()
    yield p
    p.stop()


def test_a_refused_link_resets_and_refuses_that_broker_only(proxy):
    with (Wire(proxy.address, 5, client_id=REPLICA_OF_2) as peer, Wire(proxy.address, 5, client_id="rdkafka") as client,
          Wire(proxy.address, 5, client_id=FORWARDED_BY_3) as other):
        assert api_versions(peer) == api_versions(client) == api_versions(other) == 0
        assert proxy.peers_seen == {2, 3}
        proxy.set_link([2], "refuse")
        with pytest.raises(OSError):  # reset while open (ConnectionError is an OSError)
            api_versions(peer)
        with pytest.raises(OSError), Wire(proxy.address, 5, client_id=REPLICA_OF_2) as again:
            api_versions(again)  # a new connection from broker 2 is closed at its first request
        assert api_versions(client) == 0 and api_versions(other) == 0
        proxy.clear_links()
        with Wire(proxy.address, 5, client_id=REPLICA_OF_2) as healed:
            assert api_versions(healed) == 0


def test_the_snapshot_connection_of_a_broker_is_that_brokers_link(proxy):
    with (Wire(proxy.address, 5, client_id=f"{REPLICA_OF_2}-snapshots") as snapshots,
          Wire(proxy.address, 5, client_id="oncelog-replica-client") as client):
        assert api_versions(snapshots) == api_versions(client) == 0  # FetchSnapshot's own connection
        assert proxy.peers_seen == {2}
        proxy.set_link([2], "refuse")
        with pytest.raises(OSError):
            api_versions(snapshots)
        assert api_versions(client) == 0


def test_delay_and_blackhole_strike_the_link_and_clear_links_heals_it(proxy):
    with Wire(proxy.address, 5, client_id=REPLICA_OF_2) as peer, Wire(proxy.address, 5, client_id="c") as client:
        proxy.set_link([2], "delay", 0.5)
        started = time.monotonic()
        assert api_versions(peer) == 0
        assert time.monotonic() - started >= 0.5
        started = time.monotonic()
        assert api_versions(client) == 0
        assert time.monotonic() - started < 0.5
        proxy.set_link([2], "blackhole")
        peer.sock.settimeout(1.0)
        with pytest.raises(TimeoutError):
            api_versions(peer)
        proxy.clear_links()  # the stalled connection is reset: its caller stops waiting
    with Wire(proxy.address, 5, client_id=REPLICA_OF_2) as healed:
        assert api_versions(healed) == 0


def test_client_modes_leave_broker_links_alone(proxy):
    with Wire(proxy.address, 5, client_id=REPLICA_OF_2) as peer, Wire(proxy.address, 5, client_id="c") as client:
        proxy.set_mode("blackhole")
        client.sock.settimeout(1.0)
        with pytest.raises(TimeoutError):
            api_versions(client)
        assert api_versions(peer) == 0
        proxy.set_mode("pass")


def test_a_reset_from_the_broker_side_closes_the_client_side():
    """A broker SIGKILLed with a request unread resets its socket; the proxy must close the client's connection
    (it used to leave it open, and librdkafka waited out its 60 s socket timeout with requests in flight)."""
    import socket
    import struct
    import threading

    server = socket.create_server(("127.0.0.1", 0))

    def reset_after_first_bytes() -> None:
        conn, _ = server.accept()
        conn.recv(1)  # the request arrived; the rest stays unread
        time.sleep(0.2)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()  # unread data + linger 0: RST, as when the process dies

    threading.Thread(target=reset_after_first_bytes, daemon=True).start()
    proxy = FaultProxy(upstream_port=server.getsockname()[1]).start()
    try:
        with Wire(proxy.address, 5, client_id="c") as client:
            client.sock.settimeout(3.0)
            started = time.monotonic()
            with pytest.raises(ConnectionError):  # closed or reset, not a 3 s timeout
                api_versions(client)
            assert time.monotonic() - started < 2.0
    finally:
        proxy.stop()
        server.close()
