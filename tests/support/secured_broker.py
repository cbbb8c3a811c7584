"""An oncelog broker with Kafka's four client listeners, configured the way a Kafka operator would.

    PLAINTEXT       no security (the admin's way in, and `bootstrap`)
    SSL             TLS, server certificate from a trustme CA; client certificates requested, not required
    SASL_SSL        TLS + SASL: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512
    SASL_PLAINTEXT  SASL without TLS: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512
    MTLS            TLS with client certificates required (principal: the certificate's DN)

The same names and `client_config()` as tests/support/kafka.py's KafkaCluster, so a client test can run against
either. PLAIN users come from each SASL listener's JAAS config; SCRAM users are created after start through
AlterUserScramCredentials on the PLAINTEXT listener (confluent-kafka's admin client), as `kafka-configs` does.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from oncelog.embedded import BrokerProcess
from tests.support.kafka import DEFAULT_USERS, TlsMaterial, client_security

LISTENERS = ("PLAINTEXT", "SSL", "SASL_SSL", "SASL_PLAINTEXT", "MTLS")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def secured_settings(tls: TlsMaterial, users: Mapping[str, str] = DEFAULT_USERS) -> dict[str, str]:
    plain_users = " ".join(f'user_{name}="{password}"' for name, password in users.items())
    jaas = f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain_users};"
    settings = {
        "listeners": ",".join(f"{name}://127.0.0.1:0" for name in LISTENERS),
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_SSL:SASL_SSL,"
                                          "SASL_PLAINTEXT:SASL_PLAINTEXT,MTLS:SSL",
        "inter.broker.listener.name": "PLAINTEXT",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(tls.broker_keystore_pem),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(tls.ca_pem),
        "ssl.client.auth": "requested",
        "listener.name.mtls.ssl.client.auth": "required",
        "sasl.enabled.mechanisms": ",".join(MECHANISMS),
    }
    for listener in ("sasl_ssl", "sasl_plaintext"):
        settings[f"listener.name.{listener}.plain.sasl.jaas.config"] = jaas
    return settings


def add_scram_users(bootstrap: str, users: Mapping[str, str], mechanisms: tuple[str, ...] = MECHANISMS[1:]) -> None:
    from confluent_kafka.admin import (
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    admin = AdminClient({"bootstrap.servers": bootstrap})
    upserts = [UserScramCredentialUpsertion(name, ScramCredentialInfo(getattr(ScramMechanism, m.replace("-", "_")),
                                                                       4096), password.encode())
               for name, password in users.items() for m in mechanisms]
    for future in admin.alter_user_scram_credentials(upserts).values():
        future.result(30)


class SecuredBroker:
    """One oncelog broker with the listeners above; `client_config(listener, mechanism=..., ...)` as KafkaCluster."""

    def __init__(self, directory: Path, tls: TlsMaterial, settings: Mapping[str, Any] | None = None,
                 users: Mapping[str, str] = DEFAULT_USERS, metrics: bool = False) -> None:
        self.tls = tls
        self.users = dict(users)
        self.process = BrokerProcess(directory / "data", {**secured_settings(tls, users), **(settings or {})},
                                     metrics=metrics)

    def start(self) -> SecuredBroker:
        self.process.start()
        add_scram_users(self.bootstrap, self.users)
        return self

    def stop(self) -> None:
        self.process.stop()

    @property
    def bootstrap(self) -> str:
        return self.process.listener("PLAINTEXT")

    def bootstrap_for(self, listener: str) -> str:
        return self.process.listener(listener)

    def client_config(self, listener: str = "PLAINTEXT", **kwargs: Any) -> dict[str, str]:
        """bootstrap.servers for `listener` plus tests/support/kafka.client_security(listener, ...)."""
        protocol = "SSL" if listener.upper() == "MTLS" else listener
        if listener.upper() == "MTLS":
            kwargs.setdefault("client_cert", True)
        return {"bootstrap.servers": self.bootstrap_for(listener),
                **client_security(protocol, self.tls, **kwargs)}
