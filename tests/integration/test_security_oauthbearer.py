"""OAUTHBEARER on an oncelog SASL_SSL listener: JWTs signed by a key in a JWKS file (docs/security.md §4).

A token signed by a key of the JWKS, unexpired, with the expected audience and issuer, authenticates as
User:<sub>; an expired one, one signed by another key, one for another audience are refused with Kafka's
SASL_AUTHENTICATION_FAILED after RFC 7628's error challenge. The session lifetime is the token's (KIP-368).
"""

from __future__ import annotations

import json
import time
import uuid

import jwt
import pytest
from confluent_kafka import KafkaError, Producer
from cryptography.hazmat.primitives.asymmetric import rsa
from tests.support.kafka import TlsMaterial

from oncelog.embedded import BrokerProcess

ISSUER, AUDIENCE = "https://issuer.oncelog.test", "oncelog"


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def keys():
    return {"good": _key(), "other": _key()}


@pytest.fixture(scope="module")
def broker(tmp_path_factory, keys):
    root = tmp_path_factory.mktemp("oauth")
    tls = TlsMaterial(root / "tls")
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(keys["good"].public_key()))
    jwk.update(kid="k1", use="sig", alg="RS256")
    (root / "jwks.json").write_text(json.dumps({"keys": [jwk]}))
    b = BrokerProcess(root / "data", {
        "listeners": "SASL_SSL://127.0.0.1:0",
        "ssl.keystore.location": str(tls.broker_keystore_pem),
        "sasl.enabled.mechanisms": "OAUTHBEARER",
        "sasl.oauthbearer.jwks.endpoint.url": (root / "jwks.json").as_uri(),
        "sasl.oauthbearer.expected.audience": AUDIENCE,
        "sasl.oauthbearer.expected.issuer": ISSUER,
        "connection.failed.authentication.delay.ms": 0,
    }).start()
    b.tls = tls
    yield b
    b.stop()


def token(key, kid: str = "k1", sub: str = "svc-orders", lifetime: float = 300, aud: str = AUDIENCE,
          **extra) -> str:
    now = int(time.time())
    claims = {"sub": sub, "iss": ISSUER, "aud": aud, "iat": now, "exp": now + int(lifetime), "jti": str(uuid.uuid4()),
              **extra}
    return jwt.encode(claims, key, algorithm="RS256", headers={"kid": kid})


def producer_with(broker, tok: str) -> tuple[list, list]:
    errors: list = []
    delivered: list = []
    conf = {"bootstrap.servers": broker.listener("SASL_SSL"), "security.protocol": "SASL_SSL",
            "ssl.ca.location": str(broker.tls.ca_pem), "sasl.mechanism": "OAUTHBEARER",
            "oauth_cb": lambda _config: (tok, time.time() + 300), "error_cb": errors.append,
            "message.timeout.ms": 2000}
    producer = Producer(conf)
    producer.produce("oauth", b"v", on_delivery=lambda e, m: delivered.append(e))
    producer.flush(10)
    return delivered, errors


def test_a_signed_token_authenticates(broker, keys):
    delivered, errors = producer_with(broker, token(keys["good"]))
    assert delivered == [None] and errors == []
    delivered, errors = producer_with(broker, token(keys["good"], scope=["orders.write", "orders.read"]))
    assert delivered == [None] and errors == []


@pytest.mark.parametrize("case", ["expired", "other-key", "unknown-kid", "wrong-audience", "bad-scope"])
def test_bad_tokens_are_refused(broker, keys, case):
    tok = {"expired": lambda: token(keys["good"], lifetime=-120),
           "other-key": lambda: token(keys["other"]),
           "unknown-kid": lambda: token(keys["good"], kid="k9"),
           "wrong-audience": lambda: token(keys["good"], aud="someone-else"),
           "bad-scope": lambda: token(keys["good"], scope={"not": "a string"})}[case]()
    delivered, errors = producer_with(broker, tok)
    assert delivered and delivered[0] is not None
    auth = [e for e in errors if e.code() == KafkaError._AUTHENTICATION]
    assert auth and "Authentication failed" in auth[0].str(), errors


def test_the_session_lifetime_is_the_token_lifetime(broker, keys):
    import socket
    import ssl
    import struct

    from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

    context = ssl.create_default_context(cafile=str(broker.tls.ca_pem))
    host, port = broker.listener("SASL_SSL").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as s:
        def call(message, version):
            message.with_header(correlation_id=1, client_id="t")
            s.sendall(bytes(message.encode(version=version, header=True, framed=True)))
            size = struct.unpack(">i", s.recv(4))[0]
            frame = b""
            while len(frame) < size:
                frame += s.recv(size - len(frame))
            cls = type(message).__name__.replace("Request", "Response")
            import kafka.protocol.sasl as sasl
            return getattr(sasl, cls).decode(frame[4 + (1 if version >= 2 else 0):], version=version)

        assert call(SaslHandshakeRequest[1](mechanism="OAUTHBEARER"), 1).error_code == 0
        tok = token(keys["good"], lifetime=90)
        answer = call(SaslAuthenticateRequest[1](auth_bytes=f"n,,\x01auth=Bearer {tok}\x01\x01".encode()), 1)
        assert answer.error_code == 0
        assert 80_000 < answer.session_lifetime_ms <= 90_000
