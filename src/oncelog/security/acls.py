"""The ACL model with Kafka's wire codes: bindings, filters, and the checks Kafka makes on a CreateAcls binding.

Every enum value is the code Kafka puts on the wire (CreateAcls, DescribeAcls, DeleteAcls) and in its metadata, so
a number decoded from a request is used as it is; an unknown code becomes UNKNOWN, as Kafka's `fromCode` does,
and is refused by validation rather than by the decoder.

The filter rules are Kafka's `ResourcePatternFilter` / `AccessControlEntryFilter`: a None name, principal or host
matches anything, ANY matches any value, and the pattern type MATCH matches every stored pattern that would apply
to the named resource (the literal name, the literal wildcard "*", and every prefix of the name).

Validation reproduces what a Kafka broker answers per binding: the broker's own checks in `AclApis` (the cluster
resource's name, an empty name) and then the controller's `AclControlManager.validateNewAcl`. Kafka's broker
does *not* check the operation against the resource type; only the `kafka-acls` tool does, so that table is a
separate, opt-in check (`check_supported_operation`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import NamedTuple, Self

from oncelog.errors import ErrorCode

WILDCARD_RESOURCE = "*"  # a LITERAL pattern with this name matches every resource of its type
WILDCARD_HOST = "*"
USER_TYPE = "User"
WILDCARD_PRINCIPAL = "User:*"  # the only wildcard principal Kafka knows; "Group:*" is an ordinary name
CLUSTER_NAME = "kafka-cluster"  # the one name of the CLUSTER resource


def _pascal(name: str) -> str:
    """TRANSACTIONAL_ID -> TransactionalId: Kafka's SecurityUtils spelling, used in its log lines and ZooKeeper paths."""
    return "".join(part[:1] + part[1:].lower() for part in name.split("_"))


class _KafkaEnum(IntEnum):
    @classmethod
    def from_code(cls, code: int) -> Self:
        """The member for a wire code; UNKNOWN for a code this version does not know (never an exception)."""
        try:
            return cls(code)
        except ValueError:
            return cls["UNKNOWN"]

    @property
    def pascal_name(self) -> str:
        return _pascal(self.name)


class ResourceType(_KafkaEnum):
    UNKNOWN = 0
    ANY = 1  # filters only
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(_KafkaEnum):
    UNKNOWN = 0
    ANY = 1  # filters only: any pattern type, name compared exactly
    MATCH = 2  # filters only: every pattern that applies to the name
    LITERAL = 3
    PREFIXED = 4


class AclOperation(_KafkaEnum):
    UNKNOWN = 0
    ANY = 1  # filters only
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class AclPermissionType(_KafkaEnum):
    UNKNOWN = 0
    ANY = 1  # filters only
    DENY = 2
    ALLOW = 3


# Kafka's AclEntry.supportedOperations: what each concrete resource type can be asked for. The broker uses it for
# the KIP-430 "authorized operations" bit sets; kafka-acls refuses other operations (ALL aside) client-side.
SUPPORTED_OPERATIONS: dict[ResourceType, frozenset[AclOperation]] = {
    ResourceType.TOPIC: frozenset({
        AclOperation.READ, AclOperation.WRITE, AclOperation.CREATE, AclOperation.DESCRIBE, AclOperation.DELETE,
        AclOperation.ALTER, AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS,
    }),
    ResourceType.GROUP: frozenset({AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE}),
    ResourceType.CLUSTER: frozenset({
        AclOperation.CREATE, AclOperation.CLUSTER_ACTION, AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS,
        AclOperation.IDEMPOTENT_WRITE, AclOperation.ALTER, AclOperation.DESCRIBE,
    }),
    ResourceType.TRANSACTIONAL_ID: frozenset({AclOperation.DESCRIBE, AclOperation.WRITE}),
    ResourceType.DELEGATION_TOKEN: frozenset({AclOperation.DESCRIBE}),
    ResourceType.USER: frozenset({AclOperation.CREATE_TOKENS, AclOperation.DESCRIBE_TOKENS}),
}


@dataclass(frozen=True, slots=True)
class KafkaPrincipal:
    """A principal as Kafka writes it, "Type:name"; equality is on both parts, as Kafka's KafkaPrincipal."""

    principal_type: str
    name: str

    @classmethod
    def parse(cls, text: str) -> KafkaPrincipal:
        """Kafka's SecurityUtils.parseKafkaPrincipal: split at the first colon; both parts may be empty."""
        if not text or ":" not in text:
            raise ValueError(f"expected a string in format principalType:principalName but got {text}")
        principal_type, name = text.split(":", 1)
        return cls(principal_type, name)

    def __str__(self) -> str:
        return f"{self.principal_type}:{self.name}"

    @property
    def is_wildcard(self) -> bool:
        return self.principal_type == USER_TYPE and self.name == "*"


def parse_principal(text: str) -> KafkaPrincipal:
    return KafkaPrincipal.parse(text)


def user(name: str) -> str:
    """The principal string of a user: user("alice") == "User:alice"."""
    return f"{USER_TYPE}:{name}"


@dataclass(frozen=True, slots=True)
class ResourcePattern:
    resource_type: ResourceType
    name: str
    pattern_type: PatternType

    @property
    def is_unknown(self) -> bool:
        return self.resource_type == ResourceType.UNKNOWN or self.pattern_type == PatternType.UNKNOWN


@dataclass(frozen=True, slots=True)
class AccessControlEntry:
    principal: str
    host: str
    operation: AclOperation
    permission: AclPermissionType

    @property
    def is_unknown(self) -> bool:
        return self.operation == AclOperation.UNKNOWN or self.permission == AclPermissionType.UNKNOWN


@dataclass(frozen=True, slots=True)
class AclBinding:
    pattern: ResourcePattern
    entry: AccessControlEntry

    @property
    def is_unknown(self) -> bool:
        return self.pattern.is_unknown or self.entry.is_unknown

    def to_filter(self) -> AclBindingFilter:
        """The filter that matches exactly this binding (Kafka's AclBinding.toFilter)."""
        p, e = self.pattern, self.entry
        return AclBindingFilter(
            ResourcePatternFilter(p.resource_type, p.name, p.pattern_type),
            AccessControlEntryFilter(e.principal, e.host, e.operation, e.permission),
        )


def acl(
    resource_type: ResourceType,
    name: str,
    pattern_type: PatternType,
    principal: str,
    host: str,
    operation: AclOperation,
    permission: AclPermissionType,
) -> AclBinding:
    """A binding from its seven fields in wire order: shorter to write than the nested constructors."""
    return AclBinding(ResourcePattern(resource_type, name, pattern_type),
                      AccessControlEntry(principal, host, operation, permission))


@dataclass(frozen=True, slots=True)
class ResourcePatternFilter:
    """Kafka's ResourcePatternFilter: ANY resource type, a None name and ANY/MATCH pattern types widen it."""

    resource_type: ResourceType
    name: str | None
    pattern_type: PatternType

    @property
    def is_unknown(self) -> bool:
        return self.resource_type == ResourceType.UNKNOWN or self.pattern_type == PatternType.UNKNOWN

    def matches(self, pattern: ResourcePattern) -> bool:
        if self.resource_type != ResourceType.ANY and self.resource_type != pattern.resource_type:
            return False
        ptype = self.pattern_type
        if ptype not in (PatternType.ANY, PatternType.MATCH) and ptype != pattern.pattern_type:
            return False
        if self.name is None:
            return True
        if ptype == PatternType.ANY or ptype == pattern.pattern_type:
            return self.name == pattern.name
        # MATCH: would this stored pattern apply to the resource named self.name?
        if pattern.pattern_type == PatternType.LITERAL:
            return pattern.name == self.name or pattern.name == WILDCARD_RESOURCE
        if pattern.pattern_type == PatternType.PREFIXED:
            return self.name.startswith(pattern.name)
        return False  # Kafka throws on a stored pattern that is neither; none can be stored

    def find_indefinite_field(self) -> str | None:
        """Why this filter may match more than one pattern (Kafka's wording), or None if it cannot."""
        if self.resource_type == ResourceType.ANY:
            return "Resource type is ANY."
        if self.resource_type == ResourceType.UNKNOWN:
            return "Resource type is UNKNOWN."
        if self.name is None:
            return "Resource name is NULL."
        if self.pattern_type == PatternType.MATCH:
            return "Resource pattern type is MATCH."
        if self.pattern_type == PatternType.UNKNOWN:
            return "Resource pattern type is UNKNOWN."
        return None


@dataclass(frozen=True, slots=True)
class AccessControlEntryFilter:
    """Kafka's AccessControlEntryFilter: None principal/host and ANY operation/permission match anything.

    Matching is exact: the filter principal "User:*" finds the wildcard ACLs, not every principal's."""

    principal: str | None
    host: str | None
    operation: AclOperation
    permission: AclPermissionType

    @property
    def is_unknown(self) -> bool:
        return self.operation == AclOperation.UNKNOWN or self.permission == AclPermissionType.UNKNOWN

    def matches(self, entry: AccessControlEntry) -> bool:
        if self.principal is not None and self.principal != entry.principal:
            return False
        if self.host is not None and self.host != entry.host:
            return False
        if self.operation != AclOperation.ANY and self.operation != entry.operation:
            return False
        if self.permission != AclPermissionType.ANY and self.permission != entry.permission:
            return False
        return True

    def find_indefinite_field(self) -> str | None:
        if self.principal is None:
            return "Principal is NULL"
        if self.host is None:
            return "Host is NULL"
        if self.operation == AclOperation.ANY:
            return "Operation is ANY"
        if self.operation == AclOperation.UNKNOWN:
            return "Operation is UNKNOWN"
        if self.permission == AclPermissionType.ANY:
            return "Permission type is ANY"
        if self.permission == AclPermissionType.UNKNOWN:
            return "Permission type is UNKNOWN"
        return None


@dataclass(frozen=True, slots=True)
class AclBindingFilter:
    """What DescribeAcls and DeleteAcls send: a binding matches when both halves match."""

    pattern_filter: ResourcePatternFilter
    entry_filter: AccessControlEntryFilter

    @property
    def is_unknown(self) -> bool:
        return self.pattern_filter.is_unknown or self.entry_filter.is_unknown

    def matches(self, binding: AclBinding) -> bool:
        return self.pattern_filter.matches(binding.pattern) and self.entry_filter.matches(binding.entry)

    def matches_at_most_one(self) -> bool:
        return self.find_indefinite_field() is None

    def find_indefinite_field(self) -> str | None:
        return self.pattern_filter.find_indefinite_field() or self.entry_filter.find_indefinite_field()


ANY_PATTERN = ResourcePatternFilter(ResourceType.ANY, None, PatternType.ANY)
ANY_ENTRY = AccessControlEntryFilter(None, None, AclOperation.ANY, AclPermissionType.ANY)
ANY_BINDING = AclBindingFilter(ANY_PATTERN, ANY_ENTRY)


class AclError(NamedTuple):
    """An error code and message as they go into a CreateAcls / DeleteAcls / DescribeAcls response."""

    code: ErrorCode
    message: str


# What a Kafka broker without an authorizer answers (AclApis): DescribeAcls's wording differs from the others'.
NO_AUTHORIZER_DESCRIBE = AclError(ErrorCode.SECURITY_DISABLED, "No Authorizer is configured on the broker")
NO_AUTHORIZER_ALTER = AclError(ErrorCode.SECURITY_DISABLED, "No Authorizer is configured.")


def _invalid(message: str) -> AclError:
    return AclError(ErrorCode.INVALID_REQUEST, message)


def validate_new_binding(binding: AclBinding) -> AclError | None:
    """The error Kafka answers for this CreateAcls binding, or None if it may be stored.

    In Kafka's order: the broker's checks (AclApis.handleCreateAcls) come before the controller's
    (AclControlManager.validateNewAcl), so a CLUSTER binding named "" reports the cluster name. The host is not
    checked, as in Kafka. A request carrying UNKNOWN codes is refused whole by Kafka's request parser
    (CreateAclsRequest.validate); here such a binding gets INVALID_REQUEST on its own, which the API layer may
    widen."""
    pattern, entry = binding.pattern, binding.entry
    if pattern.resource_type == ResourceType.CLUSTER and pattern.name != CLUSTER_NAME:
        return _invalid(f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}")
    if not pattern.name:
        return _invalid("Invalid empty resource name")
    if pattern.resource_type in (ResourceType.UNKNOWN, ResourceType.ANY):
        return _invalid(f"Invalid resourceType {pattern.resource_type.name}")
    if pattern.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
        return _invalid(f"Invalid patternType {pattern.pattern_type.name}")
    if entry.operation in (AclOperation.UNKNOWN, AclOperation.ANY):
        return _invalid(f"Invalid operation {entry.operation.name}")
    if entry.permission not in (AclPermissionType.DENY, AclPermissionType.ALLOW):
        return _invalid(f"Invalid permissionType {entry.permission.name}")
    if ":" not in entry.principal:
        return _invalid(
            f"Could not parse principal from `{entry.principal}` "
            "(no colon is present separating the principal type from the principal name)"
        )
    return None


def check_supported_operation(binding: AclBinding) -> AclError | None:
    """The kafka-acls tool's check: the operation is ALL or one the resource type supports.

    Not applied by a Kafka broker (a TOPIC CLUSTER_ACTION ACL is stored and never matches a request), so not part
    of `validate_new_binding`; a caller that wants the stricter behaviour applies both."""
    supported = SUPPORTED_OPERATIONS.get(binding.pattern.resource_type)
    operation = binding.entry.operation
    if supported is None or operation == AclOperation.ALL or operation in supported:
        return None
    names = ", ".join(op.name for op in sorted({AclOperation.ALL, *supported}))
    return _invalid(f"ResourceType {binding.pattern.resource_type.name} only supports operations {names}")


def validate_filter(binding_filter: AclBindingFilter) -> AclError | None:
    """DeleteAcls per-filter check (AclControlManager.validateFilter): no UNKNOWN in either half."""
    if binding_filter.pattern_filter.is_unknown:
        return _invalid("Unknown patternFilter.")
    if binding_filter.entry_filter.is_unknown:
        return _invalid("Unknown entryFilter.")
    return None
