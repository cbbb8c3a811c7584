"""An oncelog broker with ACLs on (StandardAuthorizer semantics), for tests of what each principal may do.

One SASL_PLAINTEXT listener with PLAIN users: `admin` (a super user: it grants and revokes), `alice` and `bob`
(each only what a test grants), all with password "<name>-secret". `client(name)` gives confluent-kafka settings
for a user; `grant()` / `revoke()` go through CreateAcls / DeleteAcls as admin, as `kafka-acls` does.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from oncelog.embedded import BrokerProcess

USERS = ("admin", "alice", "bob")
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


def acl_settings(users: tuple[str, ...] = USERS) -> dict[str, str]:
    plain = " ".join(f'user_{u}="{u}-secret"' for u in users)
    return {
        "listeners": "SASL_PLAINTEXT://127.0.0.1:0",
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config":
            f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain};",
        "authorizer.class.name": AUTHORIZER,
        "super.users": "User:admin",
    }


class AclBroker:
    def __init__(self, directory: Path, settings: Mapping[str, Any] | None = None) -> None:
        self.process = BrokerProcess(directory / "data", {**acl_settings(), **(settings or {})})

    def start(self) -> AclBroker:
        self.process.start()
        return self

    def stop(self) -> None:
        self.process.stop()

    @property
    def bootstrap(self) -> str:
        return self.process.listener("SASL_PLAINTEXT")

    def client(self, user: str, **extra: Any) -> dict[str, Any]:
        """confluent-kafka settings for `user` (kafka-python: `kafka_python(user)`)."""
        return {"bootstrap.servers": self.bootstrap, "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "PLAIN", "sasl.username": user, "sasl.password": f"{user}-secret", **extra}

    def kafka_python(self, user: str) -> dict[str, Any]:
        return {"bootstrap_servers": self.bootstrap, "security_protocol": "SASL_PLAINTEXT",
                "sasl_mechanism": "PLAIN", "sasl_plain_username": user, "sasl_plain_password": f"{user}-secret"}

    def admin(self, user: str = "admin") -> Any:
        from confluent_kafka.admin import AdminClient

        return AdminClient(self.client(user))

    def grant(self, user: str, resource: str, name: str, *operations: str, pattern: str = "LITERAL",
              permission: str = "ALLOW", host: str = "*") -> None:
        """e.g. grant("alice", "TOPIC", "orders", "WRITE", "DESCRIBE"); resource TOPIC, GROUP, CLUSTER (or
        confluent-kafka's BROKER; name "kafka-cluster"), TRANSACTIONAL_ID; principal "User:<user>" ("*": User:*)."""
        from confluent_kafka.admin import (
            AclBinding,
            AclOperation,
            AclPermissionType,
            ResourcePatternType,
            ResourceType,
        )

        principal = "User:*" if user == "*" else f"User:{user}"
        resource = {"CLUSTER": "BROKER"}.get(resource, resource)  # confluent-kafka's name of Kafka's Cluster
        bindings = [AclBinding(getattr(ResourceType, resource), name, getattr(ResourcePatternType, pattern),
                               principal, host, getattr(AclOperation, op), getattr(AclPermissionType, permission))
                    for op in operations]
        admin = self.admin()  # kept referenced until the answer: a destroyed handle fails its futures
        for future in admin.create_acls(bindings).values():
            future.result(30)

    def revoke_all(self) -> None:
        from confluent_kafka.admin import (
            AclBindingFilter,
            AclOperation,
            AclPermissionType,
            ResourcePatternType,
            ResourceType,
        )

        any_filter = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                                      AclPermissionType.ANY)
        admin = self.admin()
        for future in admin.delete_acls([any_filter]).values():
            future.result(30)
