"""Kafka's StandardAuthorizer decisions over an immutable ACL snapshot, with its authorization log.

The rules (StandardAuthorizerData.findAclRule / findResult, Authorizer.authorizeByResourceType):

- a principal in `super.users` (compared as the "Type:name" string) may do anything, whatever the ACLs say;
- the ACLs that apply to a resource are the LITERAL ones on its name, the LITERAL wildcard "*" of its type and
  every PREFIXED one whose name starts the resource's name; of those, an ACL counts when its principal is the
  caller's or "User:*" and its host is the caller's or "*";
- an ACL's operation matches the requested one when equal, when it is ALL (ALLOW and DENY alike), and, for ALLOW
  only, when READ/WRITE/DELETE/ALTER stand for DESCRIBE and ALTER_CONFIGS for DESCRIBE_CONFIGS. So DENY READ does
  not deny DESCRIBE and DENY DESCRIBE does not deny READ;
- any matching DENY wins over every ALLOW; otherwise one matching ALLOW allows;
- with no match: denied if *any* ACL applies to the resource (whoever it names, whatever operation), else the
  default, `allow.everyone.if.no.acl.found`.

Why a snapshot: decisions are made on the event loop for every request, so they must be cheap and must never see
half an update. `AclSnapshot` is built once from the full list (literal patterns in a dict keyed by (type, name),
prefixed ones in a sorted list searched with bisect, the way Kafka walks its reverse-sorted set) and never
changes; an ACL change builds a new one and `Authorizer.update` swaps the reference, which a reader picks up
whole at its next decision. A decision costs one dict lookup (a name with a LITERAL ACL) or a few bisects, then
a look at the ACLs that apply to that name only, by principal: never a scan of the others.

The audit log is Kafka's `kafka.authorizer.logger` with Kafka's line format: a denial at INFO, an allow at DEBUG,
and the ones the caller asked not to log (a filter over listed resources, an "authorized operations" probe) at
TRACE (level 5 here; Python has no TRACE). Each line is formatted only if its level is enabled.
"""

from __future__ import annotations

import logging
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from .acls import (
    WILDCARD_HOST,
    WILDCARD_PRINCIPAL,
    WILDCARD_RESOURCE,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    KafkaPrincipal,
    PatternType,
    ResourceType,
)

TRACE = 5
AUDIT_LOGGER_NAME = "kafka.authorizer.logger"
audit_log = logging.getLogger(AUDIT_LOGGER_NAME)
log = logging.getLogger("oncelog.security.authorizer")

SUPER_USERS_CONFIG = "super.users"
ALLOW_EVERYONE_IF_NO_ACL_FOUND_CONFIG = "allow.everyone.if.no.acl.found"

# The resource name Kafka's authorizeByResourceType asks about first, so super users and catch-all ACLs (the
# wildcard, a prefix of "hardcode", the no-ACL default) answer without a scan. Kept for Kafka's exact behaviour.
PROBE_RESOURCE_NAME = "hardcode"

_ALL_OPERATIONS = frozenset(AclOperation)
# For an ALLOW ACL: the requested operations it grants (StandardAuthorizerData.IMPLIES_DESCRIBE and
# IMPLIES_DESCRIBE_CONFIGS read the other way round). A DENY ACL denies only its own operation, or all for ALL.
_IMPLIES_DESCRIBE = frozenset({
    AclOperation.DESCRIBE, AclOperation.READ, AclOperation.WRITE, AclOperation.DELETE, AclOperation.ALTER,
})
_IMPLIES_DESCRIBE_CONFIGS = frozenset({AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS})


def _granted_operations(operation: AclOperation, permission: AclPermissionType) -> frozenset[AclOperation]:
    if operation == AclOperation.ALL:
        return _ALL_OPERATIONS
    ops = {operation}
    if permission == AclPermissionType.ALLOW:
        if operation in _IMPLIES_DESCRIBE:
            ops.add(AclOperation.DESCRIBE)
        if operation in _IMPLIES_DESCRIBE_CONFIGS:
            ops.add(AclOperation.DESCRIBE_CONFIGS)
    return frozenset(ops)


class Decision(NamedTuple):
    """One authorization result and the rule that gave it, named as Kafka's audit line names it."""

    allowed: bool
    rule: str  # "SuperUser", "MatchingAcl", "DefaultAllow" or "DefaultDeny"
    acl: AclBinding | None = None

    def describe_rule(self) -> str:
        if self.acl is None:
            return self.rule
        p, e = self.acl.pattern, self.acl.entry
        return (
            f"MatchingAcl(acl=StandardAcl[resourceType={p.resource_type.name}, resourceName={p.name}, "
            f"patternType={p.pattern_type.name}, principal={e.principal}, host={e.host}, "
            f"operation={e.operation.name}, permissionType={e.permission.name}])"
        )


SUPER_USER = Decision(True, "SuperUser")
DEFAULT_ALLOW = Decision(True, "DefaultAllow")
DEFAULT_DENY = Decision(False, "DefaultDeny")

# An entry of a pattern's bucket: (host, requested operations it matches, its precomputed Decision).
_Entry = tuple[str, frozenset[AclOperation], Decision]
# A bucket: the ACLs of one resource pattern, by principal string, so a decision reads two short lists.
_Bucket = dict[str, tuple[_Entry, ...]]
# authorizeByResourceType's view: (pattern type, name, host, operation, is DENY).
_TypeEntry = tuple[PatternType, str, str, AclOperation, bool]


class AclSnapshot:
    """An immutable, indexed set of ACL bindings; build a new one to change anything.

    Per resource type: the PREFIXED pattern names sorted, each with its chain (its own bucket, then those of the
    shorter PREFIXED patterns that start it, longest first); the wildcard's bucket; and for every LITERAL name the
    whole tuple of buckets that apply to it (its own, its prefix chain, the wildcard). A name with a LITERAL ACL
    is decided from one dict lookup; any other name costs a few bisects to find its longest PREFIXED pattern."""

    __slots__ = ("_bindings", "_literal", "_prefix_names", "_prefix_chains", "_wildcard", "_by_type_principal")

    def __init__(self, bindings: Iterable[AclBinding] = ()) -> None:
        unique = tuple(dict.fromkeys(bindings))  # a set, in first-seen order (DescribeAcls answers in it)
        literal: dict[tuple[ResourceType, str], dict[str, list[_Entry]]] = {}
        prefixed: dict[ResourceType, dict[str, dict[str, list[_Entry]]]] = {}
        by_type_principal: dict[tuple[ResourceType, str], list[_TypeEntry]] = {}
        for binding in unique:
            p, e = binding.pattern, binding.entry
            if p.pattern_type == PatternType.LITERAL:
                bucket = literal.setdefault((p.resource_type, p.name), {})
            elif p.pattern_type == PatternType.PREFIXED:
                bucket = prefixed.setdefault(p.resource_type, {}).setdefault(p.name, {})
            else:
                raise ValueError(f"An ACL must be LITERAL or PREFIXED, not {p.pattern_type.name}: {binding}")
            if e.permission not in (AclPermissionType.ALLOW, AclPermissionType.DENY):
                raise ValueError(f"An ACL must ALLOW or DENY, not {e.permission.name}: {binding}")
            deny = e.permission == AclPermissionType.DENY
            entry = (e.host, _granted_operations(e.operation, e.permission), Decision(not deny, "MatchingAcl", binding))
            bucket.setdefault(e.principal, []).append(entry)
            by_type_principal.setdefault((p.resource_type, e.principal), []).append(
                (p.pattern_type, p.name, e.host, e.operation, deny))
        self._bindings = unique
        self._by_type_principal = {key: tuple(v) for key, v in by_type_principal.items()}

        self._prefix_names: dict[ResourceType, list[str]] = {}
        self._prefix_chains: dict[ResourceType, list[tuple[_Bucket, ...]]] = {}
        for rtype, by_name in prefixed.items():
            names = sorted(by_name)
            chains: list[tuple[_Bucket, ...]] = [()] * len(names)
            for i in sorted(range(len(names)), key=lambda j: len(names[j])):  # a pattern's prefixes come first
                parent = _longest_prefix(names, names[i][:-1])
                chains[i] = (_freeze(by_name[names[i]]),) + (chains[parent] if parent >= 0 else ())
            self._prefix_names[rtype] = names
            self._prefix_chains[rtype] = chains

        frozen = {key: _freeze(bucket) for key, bucket in literal.items()}
        self._wildcard: dict[ResourceType, tuple[_Bucket, ...]] = {
            rtype: (bucket,) for (rtype, name), bucket in frozen.items() if name == WILDCARD_RESOURCE
        }
        self._literal: dict[tuple[ResourceType, str], tuple[_Bucket, ...]] = {}
        for (rtype, name), bucket in frozen.items():
            rest = self._wildcard.get(rtype, ()) if name != WILDCARD_RESOURCE else ()
            self._literal[(rtype, name)] = (bucket,) + self._prefix_chain(rtype, name) + rest

    @property
    def bindings(self) -> tuple[AclBinding, ...]:
        return self._bindings

    def __len__(self) -> int:
        return len(self._bindings)

    def acls(self, binding_filter: AclBindingFilter) -> list[AclBinding]:
        """The bindings a DescribeAcls filter selects."""
        return [b for b in self._bindings if binding_filter.matches(b)]

    def _prefix_chain(self, resource_type: ResourceType, name: str) -> tuple[_Bucket, ...]:
        """The buckets of every PREFIXED pattern that starts `name`, longest first."""
        names = self._prefix_names.get(resource_type)
        if not names:
            return ()
        i = _longest_prefix(names, name)
        return self._prefix_chains[resource_type][i] if i >= 0 else ()

    def decide(
        self,
        principal: str,
        host: str,
        operation: AclOperation,
        resource_type: ResourceType,
        name: str,
        no_acl: Decision = DEFAULT_DENY,
    ) -> Decision:
        """The ACL decision for one literal resource (super users are the Authorizer's business)."""
        buckets = self._literal.get((resource_type, name))
        if buckets is None:
            buckets = self._prefix_chain(resource_type, name) if self._prefix_names else ()
            if name != WILDCARD_RESOURCE:
                buckets += self._wildcard.get(resource_type, ())
        if not buckets:
            return no_acl
        allow: Decision | None = None
        for bucket in buckets:
            for who in (principal, WILDCARD_PRINCIPAL):
                entries = bucket.get(who)
                if entries is None:
                    continue
                for acl_host, ops, decision in entries:
                    if operation in ops and (acl_host == WILDCARD_HOST or acl_host == host):
                        if not decision.allowed:
                            return decision
                        allow = decision
        return allow if allow is not None else DEFAULT_DENY

    def any_allowed(self, principal: str, host: str, operation: AclOperation, resource_type: ResourceType) -> bool:
        """The ACL scan of Kafka's Authorizer.authorizeByResourceType (after its probe of one made-up name).

        Only ACLs naming the operation itself or ALL count (no implied DESCRIBE here). A wildcard DENY denies; a
        wildcard ALLOW then allows; otherwise some LITERAL ALLOW whose name has no LITERAL DENY and no PREFIXED
        DENY on a prefix of it, or some PREFIXED ALLOW with no PREFIXED DENY on a prefix of it, allows. A LITERAL
        DENY does not cancel a PREFIXED ALLOW of the same name: the prefix still covers other names."""
        deny_literal: set[str] = set()
        deny_prefixed: set[str] = set()
        allow_literal: list[str] = []
        allow_prefixed: list[str] = []
        wildcard_allow = False
        who_all = (principal,) if principal == WILDCARD_PRINCIPAL else (principal, WILDCARD_PRINCIPAL)
        for who in who_all:
            for pattern_type, name, acl_host, acl_op, deny in self._by_type_principal.get((resource_type, who), ()):
                if acl_host != host and acl_host != WILDCARD_HOST:
                    continue
                if acl_op != operation and acl_op != AclOperation.ALL:
                    continue
                literal = pattern_type == PatternType.LITERAL
                if deny:
                    if literal and name == WILDCARD_RESOURCE:
                        return False
                    (deny_literal if literal else deny_prefixed).add(name)
                elif literal and name == WILDCARD_RESOURCE:
                    wildcard_allow = True
                else:
                    (allow_literal if literal else allow_prefixed).append(name)
        if wildcard_allow:
            return True

        def dominated(name: str) -> bool:
            return any(name[:i] in deny_prefixed for i in range(1, len(name) + 1))

        for name in allow_literal:
            if name not in deny_literal and not dominated(name):
                return True
        return any(not dominated(name) for name in allow_prefixed)


def _freeze(bucket: dict[str, list[_Entry]]) -> _Bucket:
    return {principal: tuple(entries) for principal, entries in bucket.items()}


def _longest_prefix(names: list[str], name: str) -> int:
    """The index in sorted `names` of the longest one that starts `name`, or -1.

    `names[i]`, the greatest name <= the bound, either starts `name` (the longest that does: a longer one would
    lie between it and `name`) or shares only its first k characters with `name`; then no name longer than k can
    start `name` (it too would lie between names[i] and `name`), so search again below i with the bound name[:k].
    Each step is one bisect over a shrinking range: Kafka walks its reverse-ordered set the same way."""
    bound = name
    hi = len(names)
    while bound:
        i = bisect_right(names, bound, 0, hi) - 1
        if i < 0:
            return -1
        candidate = names[i]
        if name.startswith(candidate):
            return i
        k = 0
        limit = min(len(candidate), len(name))
        while k < limit and candidate[k] == name[k]:
            k += 1
        bound = name[:k]
        hi = i
    return -1


def parse_super_users(value: str | None) -> frozenset[str]:
    """`super.users` as Kafka reads it: ";"-separated principals, blanks skipped, each "Type:name"."""
    users: set[str] = set()
    for part in (value or "").split(";"):
        part = part.strip()
        if part:
            KafkaPrincipal.parse(part)  # ValueError with Kafka's message if malformed
            users.add(part)
    return frozenset(users)


class Authorizer:
    """Authorization decisions for the broker: super users, then the current snapshot, then the default."""

    def __init__(
        self,
        super_users: Iterable[str] = (),
        allow_everyone_if_no_acl_found: bool = False,
        snapshot: AclSnapshot | None = None,
    ) -> None:
        self.super_users = frozenset(super_users)
        self.allow_everyone_if_no_acl_found = allow_everyone_if_no_acl_found
        self._no_acl = DEFAULT_ALLOW if allow_everyone_if_no_acl_found else DEFAULT_DENY
        self._snapshot = snapshot if snapshot is not None else AclSnapshot()

    @property
    def snapshot(self) -> AclSnapshot:
        return self._snapshot

    def set_snapshot(self, snapshot: AclSnapshot) -> None:
        """Swap in a new snapshot; a decision in progress finishes on the old one."""
        self._snapshot = snapshot
        log.info("Initialized with %d acl(s).", len(snapshot))

    def update(self, bindings: Iterable[AclBinding]) -> None:
        """Rebuild from the full list of bindings (an AclStore listener)."""
        self.set_snapshot(AclSnapshot(bindings))

    def decide(
        self, principal: str, host: str, operation: AclOperation, resource_type: ResourceType, name: str
    ) -> Decision:
        """The decision and the rule behind it, without logging."""
        if principal in self.super_users:
            return SUPER_USER
        return self._snapshot.decide(principal, host, operation, resource_type, name, self._no_acl)

    def authorize(
        self,
        principal: str,
        host: str,
        operation: AclOperation,
        resource_type: ResourceType,
        name: str,
        *,
        request_name: str = "Unknown",
        ref_count: int = 1,
        log_if_allowed: bool = True,
        log_if_denied: bool = True,
    ) -> bool:
        """May `principal`, connected from `host`, do `operation` on the LITERAL resource (type, name)?

        `request_name` is the API's name as Kafka logs it ("Produce", "Metadata"); `ref_count` how many times the
        request names the resource. `log_if_*` False moves that outcome's audit line to TRACE, as Kafka's
        Action.logIfAllowed / logIfDenied."""
        if principal in self.super_users:
            decision = SUPER_USER
        else:
            decision = self._snapshot.decide(principal, host, operation, resource_type, name, self._no_acl)
        if decision.allowed:
            level = logging.DEBUG if log_if_allowed else TRACE
        else:
            level = logging.INFO if log_if_denied else TRACE
        if audit_log.isEnabledFor(level):
            audit_log.log(level, audit_line(principal, host, operation, resource_type, name, decision,
                                            request_name, ref_count))
        return decision.allowed

    def authorize_any(
        self,
        principal: str,
        host: str,
        operation: AclOperation,
        resource_type: ResourceType,
        *,
        request_name: str = "Unknown",
    ) -> bool:
        """Is there any resource of this type the principal may do `operation` on? (authorizeByResourceType)

        Used where Kafka accepts "WRITE on some topic" for IDEMPOTENT_WRITE (KIP-679). Kafka's order: a probe of
        the made-up name "hardcode" first (super users, wildcard and catch-all prefix ACLs, and the no-ACL default
        answer there; its allow is logged at DEBUG, its denial only at TRACE), then the scan of `any_allowed`."""
        if resource_type in (ResourceType.ANY, ResourceType.UNKNOWN):
            raise ValueError(f"authorize_any needs a concrete resource type, not {resource_type.name}")
        if operation in (AclOperation.ANY, AclOperation.UNKNOWN):
            raise ValueError(f"authorize_any needs a concrete operation, not {operation.name}")
        if self.authorize(principal, host, operation, resource_type, PROBE_RESOURCE_NAME,
                          request_name=request_name, ref_count=0, log_if_allowed=True, log_if_denied=False):
            return True
        return self._snapshot.any_allowed(principal, host, operation, resource_type)

    def filter(
        self,
        principal: str,
        host: str,
        operation: AclOperation,
        resource_type: ResourceType,
        names: Sequence[str],
        *,
        request_name: str = "Unknown",
        log_if_allowed: bool = True,
        log_if_denied: bool = True,
    ) -> list[str]:
        """The names the principal may do `operation` on, in the order given (duplicates kept).

        Each distinct name is decided once, its audit line carrying how often it was named (Kafka's
        AuthHelper.filterByAuthorized)."""
        counts: dict[str, int] = {}
        for name in names:
            counts[name] = counts.get(name, 0) + 1
        allowed = {
            name for name, count in counts.items()
            if self.authorize(principal, host, operation, resource_type, name, request_name=request_name,
                              ref_count=count, log_if_allowed=log_if_allowed, log_if_denied=log_if_denied)
        }
        return [name for name in names if name in allowed]


def audit_line(
    principal: str,
    host: str,
    operation: AclOperation,
    resource_type: ResourceType,
    name: str,
    decision: Decision,
    request_name: str,
    ref_count: int,
) -> str:
    """Kafka's StandardAuthorizerData.buildAuditMessage, word for word."""
    return (
        f"Principal = {principal} is {'Allowed' if decision.allowed else 'Denied'} "
        f"operation = {operation.name} from host = {host} "
        f"on resource = {resource_type.pascal_name}:LITERAL:{name} "
        f"for request = {request_name} with resourceRefCount = {ref_count} "
        f"based on rule {decision.describe_rule()}"
    )
