"""End-to-end fuzzing of the authentication path: a live broker with a SASL_PLAINTEXT listener (PLAIN and
SCRAM-SHA-256) and an SSL listener takes garbage instead of a SASL handshake, SaslAuthenticate before SaslHandshake,
damaged, oversized and malformed tokens, random bytes on its TLS port, a TLS ClientHello on its plaintext ports, and
many half-open handshakes at once, while a well-behaved client keeps working on connections of its own.

Oracles: the broker stays up; whatever it answers is an answer to the request sent, in order, with one of the
error codes Kafka documents for it (SaslHandshake NONE / UNSUPPORTED_SASL_MECHANISM / ILLEGAL_SASL_STATE,
SaslAuthenticate NONE / ILLEGAL_SASL_STATE / SASL_AUTHENTICATION_FAILED, ApiVersions NONE / UNSUPPORTED_VERSION); a
request other than those before authentication is never answered; every connection ends once the client has said
all it will (no hang); the well-behaved client is never refused or kept waiting; and the broker's log holds no
traceback (an exception that escaped a handler, a protocol callback or the event loop). Bounded by
FUZZ_AUTH_EXAMPLES inputs per target and FUZZ_SECONDS; `make fuzz` runs many more.
"""

from __future__ import annotations

import os
import socket
import ssl
import struct
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest

from tests.fuzz import auth_corpus as seeds
from tests.fuzz import corpus
from tests.fuzz.mutate import FUZZ_SETTINGS, SECONDS, damaged, record_iterations
from tests.fuzz.test_fuzz_broker import handler_failures
from tests.support.broker import BrokerProcess
from tests.support.kafka import HOST, TlsMaterial
from tests.support.secured_broker import add_scram_users
from tests.support.wire import Wire, sasl_plain_wire

EXAMPLES = int(os.environ.get("FUZZ_AUTH_EXAMPLES", "40"))
HALF_OPEN = int(os.environ.get("FUZZ_AUTH_HALF_OPEN", "60"))  # connections of each kind held half open at once
AUTH_TIMEOUT_MS = 2000
API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE, METADATA = 18, 17, 36, 3
DOCUMENTED = {SASL_HANDSHAKE: {0, 33, 34}, SASL_AUTHENTICATE: {0, 34, 58}, API_VERSIONS: {0, 35}}
LOG_FAULTS = ("Traceback", "Exception in callback", "Fatal error", "Task exception was never retrieved",
              "Unhandled error")


class WellBehavedClient(threading.Thread):
    """Throughout the module: a Metadata request every 0.1 s on one SASL PLAIN connection authenticated at the
    start, and every second a fresh authenticated SASL connection and a fresh TLS connection, each with a request.
    Every failure is kept with the time it happened."""

    def __init__(self, broker: BrokerProcess, tls: TlsMaterial) -> None:
        super().__init__(daemon=True, name="well-behaved-client")
        self.broker, self.tls = broker, tls
        self.failures: list[str] = []
        self.requests = 0
        self._done = threading.Event()

    def run(self) -> None:
        try:
            wire = sasl_plain_wire(self.broker.listener("SASL_PLAINTEXT"), seeds.USER, seeds.PASSWORD, timeout=5)
        except Exception as exc:  # noqa: BLE001 - a failure is the finding
            self.failures.append(f"start: {exc!r}")
            return
        last_fresh = 0.0
        while not self._done.wait(0.1):
            try:
                answer = wire.request(MetadataRequest[9](topics=[], allow_auto_topic_creation=False), 9)
                assert answer.brokers, answer
                self.requests += 1
                if time.monotonic() - last_fresh >= 1.0:
                    last_fresh = time.monotonic()
                    with sasl_plain_wire(self.broker.listener("SASL_PLAINTEXT"), seeds.USER, seeds.PASSWORD,
                                         timeout=5) as fresh:
                        fresh.request(ApiVersionsRequest[3](client_software_name="t", client_software_version="1"), 3)
                    assert tls_api_versions(self.broker, self.tls)
                    self.requests += 2
            except Exception as exc:  # noqa: BLE001
                self.failures.append(f"{time.strftime('%H:%M:%S')}: {exc!r}")
                wire.close()
                try:
                    wire = sasl_plain_wire(self.broker.listener("SASL_PLAINTEXT"), seeds.USER, seeds.PASSWORD,
                                           timeout=5)
                except Exception as again:  # noqa: BLE001
                    self.failures.append(f"reconnect: {again!r}")
        wire.close()

    def stop(self) -> None:
        self._done.set()
        self.join(10)


def tls_api_versions(broker: BrokerProcess, tls: TlsMaterial) -> bool:
    context = ssl.create_default_context(cafile=str(tls.ca_pem))
    host, port = broker.listener("SSL").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname=HOST) as sock:
        sock.sendall(corpus_frame(API_VERSIONS, 0, b"", 99))
        head = _exact(sock, 4)
        frame = _exact(sock, struct.unpack(">i", head)[0])
    return struct.unpack_from(">ih", frame) == (99, 0)


def _exact(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return out


def corpus_frame(api_key: int, version: int, body: bytes, correlation_id: int) -> bytes:
    frame = corpus.frame(api_key, version, body, correlation_id)
    return struct.pack(">i", len(frame)) + frame


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    directory = tmp_path_factory.mktemp("fuzz-auth")
    tls = TlsMaterial(directory / "tls")
    users = " ".join(f'user_{u}="{p}"' for u, p in seeds.PLAIN_USERS.items())
    broker = BrokerProcess(directory / "data", {
        "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0",
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config":
            f"org.apache.kafka.common.security.plain.PlainLoginModule required {users};",
        "ssl.keystore.location": str(tls.broker_keystore_pem),
        "ssl.truststore.location": str(tls.ca_pem),
        "ssl.client.auth": "requested",
        "connection.failed.authentication.delay.ms": 5,
        "oncelog.authentication.timeout.ms": AUTH_TIMEOUT_MS,
    }).start()
    add_scram_users(broker.bootstrap, {seeds.USER: seeds.PASSWORD}, ("SCRAM-SHA-256",))
    client = WellBehavedClient(broker, tls)
    client.start()
    state = {"broker": broker, "tls": tls, "client": client, "sent": 0, "answered": 0,
             "deadline": time.monotonic() + SECONDS}
    yield state
    client.stop()
    record_iterations("broker auth path over TCP", state["sent"])
    print(f"auth path: {state['sent']} inputs, {state['answered']} answers; the well-behaved client made "
          f"{client.requests} requests, {len(client.failures)} failed")
    alive = broker.alive()
    text = broker.log_path.read_text(errors="replace")
    if alive:
        broker.stop()
    assert alive, "the broker died"
    assert not client.failures, client.failures[:10]
    assert not handler_failures(text)
    faults = [line for line in text.splitlines() if any(f in line for f in LOG_FAULTS)]
    assert not faults, "\n".join(faults[:20])


def still_fine(state: dict) -> None:
    assert state["broker"].alive(), state["broker"].log_tail()
    assert not state["client"].failures, state["client"].failures[:10]


def connect(state: dict, listener: str) -> socket.socket:
    host, port = state["broker"].listener(listener).rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=5)


def read_frames(sock: socket.socket, quiet: float = 0.3) -> tuple[list[bytes], bool]:
    """Answers until the broker stays quiet for `quiet` s or closes; (frames, closed)."""
    frames, buf = [], b""
    sock.settimeout(quiet)
    while True:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            return frames, False
        except ConnectionResetError:
            return frames, True
        if not chunk:
            return frames, True
        buf += chunk
        while len(buf) >= 4 and len(buf) - 4 >= struct.unpack_from(">i", buf)[0]:
            size = struct.unpack_from(">i", buf)[0]
            frames.append(buf[4:4 + size])
            buf = buf[4 + size:]


def ends(sock: socket.socket, timeout: float = 5.0) -> bool:
    """After the client's EOF, does the broker end the connection (whatever it still sends first)?"""
    try:
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        return True
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        return False
    return True


def error_code(api_key: int, version: int, frame: bytes) -> int:
    flexible = api_key == SASL_AUTHENTICATE and version >= 2
    return struct.unpack_from(">h", frame, 5 if flexible else 4)[0]


# -- inputs ---------------------------------------------------------------------------------------------------------

def _handshake(mechanism: str) -> bytes:
    raw = mechanism.encode()
    return struct.pack(">h", len(raw)) + raw


def _authenticate(version: int, token: bytes) -> bytes:
    if version >= 2:  # compact bytes, then no tagged fields
        from oncelog.protocol.primitives import encode_uvarint

        return encode_uvarint(len(token) + 1) + token + b"\x00"
    return struct.pack(">i", len(token)) + token


TOKENS = st.one_of(damaged(seeds.plain_tokens()), damaged(seeds.scram_first_messages()),
                   st.binary(max_size=64), st.just(f"\0{seeds.USER}\0{seeds.PASSWORD}".encode()))
# One request of a conversation: (api key, version, body, damage the header?)
REQUEST = st.one_of(
    st.tuples(st.just(SASL_HANDSHAKE), st.just(1),
              st.one_of(st.sampled_from(["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", ""]).map(_handshake),
                        damaged([_handshake("PLAIN"), _handshake("SCRAM-SHA-256")]))),
    st.tuples(st.just(SASL_AUTHENTICATE), st.integers(0, 2)).flatmap(
        lambda kv: st.tuples(st.just(kv[0]), st.just(kv[1]), st.one_of(
            TOKENS.map(lambda t, v=kv[1]: _authenticate(v, t)),
            damaged([_authenticate(kv[1], t) for t in seeds.plain_tokens()])))),
    st.tuples(st.just(API_VERSIONS), st.integers(0, 5), st.just(b"")),
    st.tuples(st.just(METADATA), st.just(9), st.just(b"\x01\x00\x00\x00")),
    st.tuples(st.sampled_from([0, 1, 22, 999, 0xFFFF]), st.integers(-1, 20), st.binary(max_size=32)),
)
CONVERSATIONS = st.lists(REQUEST, min_size=1, max_size=5)


def _check_answers(sent: list[tuple[int, int, int]], frames: list[bytes], authenticated: bool) -> None:
    """Answers come in the order of the requests, each with a documented code; nothing answers a request other
    than ApiVersions and SASL before authentication."""
    expected = iter(sent)
    for frame in frames:
        correlation_id = struct.unpack_from(">i", frame)[0]
        request = next((r for r in expected if r[2] == correlation_id), None)
        assert request is not None, f"answer with correlation id {correlation_id} to no request sent in order: {sent}"
        api_key, version, _ = request
        if api_key in DOCUMENTED:
            assert error_code(api_key, version, frame) in DOCUMENTED[api_key], (api_key, version, frame[:16])
        else:
            assert authenticated, f"API {api_key} answered before authentication"


@settings(FUZZ_SETTINGS, max_examples=EXAMPLES)
@given(CONVERSATIONS, st.booleans())
def test_sasl_conversations_with_damaged_requests_and_tokens(secured, conversation, one_at_a_time):
    """Garbage instead of a handshake, SaslAuthenticate before SaslHandshake, damaged mechanisms and tokens (PLAIN,
    SCRAM, random), requests before authentication, sent at once or each after the previous answer."""
    if time.monotonic() > secured["deadline"]:
        return
    sent: list[tuple[int, int, int]] = []
    frames: list[bytes] = []
    closed = False
    with connect(secured, "SASL_PLAINTEXT") as sock:
        for api_key, version, body in conversation:
            cid = 5000 + secured["sent"]
            secured["sent"] += 1
            sent.append((api_key, version, cid))
            try:
                sock.sendall(corpus_frame(api_key, version, body, cid))
            except OSError:
                closed = True
                break
            if one_at_a_time:
                got, closed = read_frames(sock)
                frames += got
                if closed:
                    break
        if not closed:
            got, closed = read_frames(sock)
            frames += got
        secured["answered"] += len(frames)
        # only a PLAIN login with the right password, after a PLAIN handshake, authenticates a connection here
        login = f"\0{seeds.USER}\0{seeds.PASSWORD}".encode()
        handshake = next((i for i, r in enumerate(conversation) if r[0] == SASL_HANDSHAKE), None)
        authenticated = handshake is not None and conversation[handshake][2] == _handshake("PLAIN") and any(
            api_key == SASL_AUTHENTICATE and login in body for api_key, _, body in conversation[handshake:])
        _check_answers(sent, frames, authenticated)
        assert closed or ends(sock), "the broker kept a connection open after the client's EOF"


@settings(FUZZ_SETTINGS, max_examples=EXAMPLES)
@given(st.sampled_from(seeds.SCRAM_MECHANISMS[:1]), st.data())
def test_scram_exchange_with_a_damaged_final_message(secured, mechanism, data):
    """A real client-first, then the real client-final (from scramp's client) damaged: SASL_AUTHENTICATION_FAILED or
    success only for the right proof, never anything else, never a hang."""
    if time.monotonic() > secured["deadline"]:
        return
    from scramp import ScramClient

    client = ScramClient([mechanism], seeds.USER, seeds.PASSWORD)
    with Wire(secured["broker"].listener("SASL_PLAINTEXT"), timeout=5) as w:
        from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

        assert w.request(SaslHandshakeRequest[1](mechanism=mechanism), 1).error_code == 0
        first = w.request(SaslAuthenticateRequest[1](auth_bytes=client.get_client_first().encode()), 1)
        assert first.error_code == 0
        client.set_server_first(first.auth_bytes.decode())
        final = client.get_client_final().encode()
        token = data.draw(st.one_of(st.just(final), damaged([final])))
        secured["sent"] += 3
        answer = w.request(SaslAuthenticateRequest[1](auth_bytes=token), 1)
        assert answer.error_code in (0, 58), answer
        if answer.error_code == 0 and token == final:
            client.set_server_final(answer.auth_bytes.decode())


def client_hellos() -> list[bytes]:
    out = []
    for name, maximum in ((HOST, None), (None, None), ("localhost", ssl.TLSVersion.TLSv1_2)):
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        if maximum:
            context.maximum_version = maximum
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        obj = context.wrap_bio(incoming, outgoing, server_hostname=name)
        try:
            obj.do_handshake()
        except ssl.SSLWantReadError:
            pass
        out.append(outgoing.read())
    return out


@settings(FUZZ_SETTINGS, max_examples=EXAMPLES)
@given(st.one_of(damaged(client_hellos()), st.binary(min_size=1, max_size=300)), st.booleans())
def test_random_bytes_on_the_tls_port(secured, data, in_pieces):
    if time.monotonic() > secured["deadline"]:
        return
    secured["sent"] += 1
    with connect(secured, "SSL") as sock:
        try:
            if in_pieces:
                for i in range(0, len(data), 7):
                    sock.sendall(data[i:i + 7])
            else:
                sock.sendall(data)
        except OSError:
            return
        assert ends(sock), "the TLS listener kept a connection open after garbage and the client's EOF"


@settings(FUZZ_SETTINGS, max_examples=EXAMPLES)
@given(st.binary(min_size=1, max_size=200), st.sampled_from(["SASL_PLAINTEXT", "SSL"]))
def test_garbage_instead_of_a_handshake(secured, data, listener):
    """Bytes that are no request at all: the broker closes, now or at the client's EOF."""
    if time.monotonic() > secured["deadline"]:
        return
    secured["sent"] += 1
    with connect(secured, listener) as sock:
        try:
            sock.sendall(data)
        except OSError:
            return
        assert ends(sock)


@pytest.mark.parametrize("listener", ["SASL_PLAINTEXT", "PLAINTEXT"])
def test_a_tls_hello_on_a_plaintext_port_is_closed_unanswered(secured, listener):
    for hello in client_hellos():
        with connect(secured, listener) as sock:
            sock.sendall(hello)
            frames, closed = read_frames(sock, quiet=5)
            assert (frames, closed) == ([], True)
    still_fine(secured)


def test_authenticate_before_handshake_is_refused_then_closed(secured):
    for version in (0, 1, 2):
        with connect(secured, "SASL_PLAINTEXT") as sock:
            sock.sendall(corpus_frame(SASL_AUTHENTICATE, version, _authenticate(version, b"\0alice\0alice-secret"), 1))
            frames, closed = read_frames(sock, quiet=5)
            assert closed and len(frames) == 1 and error_code(SASL_AUTHENTICATE, version, frames[0]) == 34
    still_fine(secured)


def test_oversized_frames_before_authentication_are_not_read(secured):
    """Before SASL authentication a frame is bounded by sasl.server.max.receive.size (512 KiB), as Kafka bounds it:
    a larger one ends the connection at its size prefix, before the broker allocates or reads the body."""
    with connect(secured, "SASL_PLAINTEXT") as sock:
        sock.sendall(corpus_frame(SASL_HANDSHAKE, 1, _handshake("PLAIN"), 1))
        frames, closed = read_frames(sock, quiet=0.5)
        assert len(frames) == 1 and not closed
        sock.sendall(corpus_frame(SASL_AUTHENTICATE, 1, _authenticate(1, b"\0" * 600_000), 2))
        assert read_frames(sock, quiet=5) == ([], True)
    started = time.monotonic()
    with connect(secured, "SASL_PLAINTEXT") as sock:
        sock.sendall(struct.pack(">i", 100 * 1024 * 1024))  # the size prefix alone
        assert read_frames(sock, quiet=5) == ([], True)
    assert time.monotonic() - started < 4
    assert "sasl.server.max.receive.size before authentication" in secured["broker"].log_path.read_text()
    with sasl_plain_wire(secured["broker"].listener("SASL_PLAINTEXT"), seeds.USER, seeds.PASSWORD) as w:
        # authenticated, the frame limit is socket.request.max.bytes again
        big = MetadataRequest[9](topics=[MetadataRequest[9].MetadataRequestTopic(name="x" * 200)
                                         for _ in range(3000)], allow_auto_topic_creation=False)
        assert w.request(big, 9).topics  # 600 KB, answered
    still_fine(secured)


def test_many_half_open_handshakes_at_once(secured):
    """HALF_OPEN connections of each kind at once: TCP only and half a ClientHello on the TLS port, TCP only,
    a SaslHandshake without SaslAuthenticate and half a frame on the SASL port. The well-behaved client is served
    meanwhile; the broker ends every one of them after oncelog.authentication.timeout.ms."""
    import resource

    # five kinds, and the broker holds a descriptor for each: stay well inside the file limit of both
    count = min(HALF_OPEN, (resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 200) // 10)
    hello = client_hellos()[0]
    handshake = corpus_frame(SASL_HANDSHAKE, 1, _handshake("PLAIN"), 1)
    kinds = [("SSL", b""), ("SSL", hello[:len(hello) // 2]), ("SASL_PLAINTEXT", b""),
             ("SASL_PLAINTEXT", handshake), ("SASL_PLAINTEXT", handshake[:7])]
    socks = []
    try:
        for listener, data in kinds:
            for _ in range(count):
                sock = connect(secured, listener)
                if data:
                    sock.sendall(data)
                socks.append(sock)
        secured["sent"] += len(socks)
        assert tls_api_versions(secured["broker"], secured["tls"])  # served while they wait
        deadline = time.monotonic() + AUTH_TIMEOUT_MS / 1000 + 10
        open_ = list(socks)
        while open_ and time.monotonic() < deadline:
            still = []
            for sock in open_:
                sock.settimeout(0.01)
                try:
                    while sock.recv(65536):
                        pass
                except TimeoutError:
                    still.append(sock)
                except OSError:
                    pass
            open_ = still
            time.sleep(0.1)
        assert not open_, f"{len(open_)} half-open connections still open after the authentication timeout"
    finally:
        for sock in socks:
            sock.close()
    still_fine(secured)


def test_connection_limits_apply_to_tls_connections_before_their_handshake(tmp_path):
    tls = TlsMaterial(tmp_path / "tls")
    with BrokerProcess(tmp_path / "data", {"listeners": "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0",
                                           "ssl.keystore.location": str(tls.broker_keystore_pem),
                                           "max.connections.per.ip": 5}) as broker:
        host, port = broker.listener("SSL").rsplit(":", 1)
        socks = [socket.create_connection((host, int(port)), timeout=5) for _ in range(10)]
        try:
            closed = 0
            time.sleep(1.5)  # the refusals, had there been any, are immediate
            for sock in socks:
                sock.settimeout(0.05)
                try:
                    closed += sock.recv(1) == b""
                except TimeoutError:
                    pass
                except ConnectionResetError:
                    closed += 1
            assert closed >= 5, f"{closed} of 10 TLS connections refused with max.connections.per.ip=5"
        finally:
            for sock in socks:
                sock.close()
        # the slots come back, also from handshakes that failed (garbage instead of a ClientHello) or were dropped
        for _ in range(5):
            with socket.create_connection((host, int(port)), timeout=5) as bad:
                bad.sendall(b"\x16\x03\x01\x00\x05hello")
                bad.settimeout(5)
                try:
                    bad.recv(100)
                except OSError:
                    pass
        time.sleep(0.5)
        context = ssl.create_default_context(cafile=str(tls.ca_pem))
        good = []
        try:
            for _ in range(5):
                raw = socket.create_connection((host, int(port)), timeout=5)
                good.append(context.wrap_socket(raw, server_hostname=host))  # a refused slot fails here
        finally:
            for sock in good:
                sock.close()
