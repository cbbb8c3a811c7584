"""DescribeUserScramCredentials and AlterUserScramCredentials (KIP-554): `kafka-configs --entity-type users
--alter --add-config 'SCRAM-SHA-256=[password=...]'` and `--describe`.

The client salts: an upsertion carries the salt, the iteration count and SaltedPassword, from which the broker
keeps StoredKey and ServerKey (security/credentials.py). Validation and error codes are Kafka's.

Describing needs DESCRIBE on the cluster, altering ALTER on it, checked first, as Kafka's: refused, a description
answers the top-level CLUSTER_AUTHORIZATION_FAILED (and one result with it per user asked about, without the name,
as DescribeUserScramCredentialsRequest.getErrorResponse), an alteration answers it for every user named (sorted,
once each) and changes nothing. A store that cannot keep the change (OSError: the file, or ZooKeeper in a cluster)
answers UNKNOWN_SERVER_ERROR for every user it would have changed, and nothing changed.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from ...errors import ErrorCode
from ...protocol.apis import ApiKey
from ...protocol.messages import decode_request, encode_response
from ...security.acls import ResourceType
from ...security.api_acls import request_name
from ...security.credentials import (
    MAX_ITERATIONS,
    MECHANISM_CODES,
    MECHANISM_NAMES,
    MIN_ITERATIONS,
    from_salted_password,
)
from ...security.settled import settled

if TYPE_CHECKING:
    from ..context import BrokerServices, RequestContext


async def handle_describe(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, ctx.api_version, body)
    if not ctx.authorized_cluster():
        code = ctx.denial(ResourceType.CLUSTER)
        message = code.message
        data = {"throttle_time_ms": 0, "error_code": code, "error_message": message,
                "results": [_user("", code, message) for _ in req.users or []]}
        return encode_response(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, ctx.api_version, data)
    known = broker.security.credentials.describe()
    results: list[dict[str, Any]] = []
    if not req.users:
        names = sorted(known)
        counts: Counter[str] = Counter()
    else:
        names = [u.name for u in req.users]
        counts = Counter(names)
    seen: set[str] = set()
    for name in names:
        if name in seen:
            continue
        seen.add(name)
        if counts[name] > 1:
            results.append(_user(name, ErrorCode.DUPLICATE_RESOURCE,
                                 "Cannot describe SCRAM credentials for the same user twice in a single request"))
        elif name not in known:
            results.append(_user(name, ErrorCode.RESOURCE_NOT_FOUND,
                                 "Attempt to describe a user credential that does not exist"))
        else:
            results.append({**_user(name, ErrorCode.NONE, None), "credential_infos": [
                {"mechanism": MECHANISM_CODES[c.mechanism], "iterations": c.iterations} for c in known[name]]})
    data = {"throttle_time_ms": 0, "error_code": 0, "error_message": None, "results": results}
    return encode_response(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, ctx.api_version, data)


def _user(name: str, error: int, message: str | None) -> dict[str, Any]:
    return {"user": name, "error_code": error, "error_message": message, "credential_infos": []}


async def handle_alter(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, ctx.api_version, body)
    if not ctx.authorized_cluster():
        code, message = ctx.denial(ResourceType.CLUSTER), f"Request {request_name(ctx.api_key)} is not authorized."
        users = sorted({e.name for e in [*req.deletions, *req.upsertions]})
        data = {"throttle_time_ms": 0,
                "results": [{"user": name, "error_code": code, "error_message": message} for name in users]}
        return encode_response(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, ctx.api_version, data)
    store = broker.security.credentials
    entries = [("delete", d) for d in req.deletions] + [("upsert", u) for u in req.upsertions]
    counts = Counter((e.name, e.mechanism) for _, e in entries)
    errors: dict[str, tuple[int, str]] = {}
    upserts, deletions = [], []
    for kind, entry in entries:
        name = entry.name
        if name in errors:
            continue
        problem = None
        mechanism = MECHANISM_NAMES.get(entry.mechanism)
        if not name:
            problem = (ErrorCode.UNACCEPTABLE_CREDENTIAL, "Username must not be empty")
        elif counts[(name, entry.mechanism)] > 1:
            problem = (ErrorCode.DUPLICATE_RESOURCE, "A user credential cannot be altered twice in the same request")
        elif mechanism is None:
            problem = (ErrorCode.UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism")
        elif kind == "delete":
            if store.get(name, mechanism) is None:
                problem = (ErrorCode.RESOURCE_NOT_FOUND, "Attempt to delete a user credential that does not exist")
            else:
                deletions.append((name, mechanism))
        elif entry.iterations < MIN_ITERATIONS:
            problem = (ErrorCode.UNACCEPTABLE_CREDENTIAL, "Too few iterations")
        elif entry.iterations > MAX_ITERATIONS:
            problem = (ErrorCode.UNACCEPTABLE_CREDENTIAL, "Too many iterations")
        elif not entry.salt or not entry.salted_password:
            problem = (ErrorCode.UNACCEPTABLE_CREDENTIAL, "Salt and salted password must not be empty")
        else:
            upserts.append((name, from_salted_password(mechanism, bytes(entry.salt), bytes(entry.salted_password),
                                                       entry.iterations)))
        if problem is not None:
            errors[name] = problem
    # a user with any bad entry changes nothing at all, as in Kafka
    upserts = [(n, c) for n, c in upserts if n not in errors]
    deletions = [(n, m) for n, m in deletions if n not in errors]
    if upserts or deletions:
        try:
            await settled(store.alter(upserts, deletions))
        except OSError as exc:
            failed = (ErrorCode.UNKNOWN_SERVER_ERROR, f"Could not store the credentials: {exc}")
            errors.update({name: failed for name, _ in [*upserts, *deletions]})
    results = []
    for name in dict.fromkeys(e.name for _, e in entries):
        code, message = errors.get(name, (ErrorCode.NONE, None))
        results.append({"user": name, "error_code": code, "error_message": message})
    data = {"throttle_time_ms": 0, "results": results}
    return encode_response(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, ctx.api_version, data)
