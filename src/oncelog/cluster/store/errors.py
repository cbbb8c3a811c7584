"""What a metadata read or write can fail with, and the names of a session's states."""

from __future__ import annotations

CONNECTED, SUSPENDED, LOST = "CONNECTED", "SUSPENDED", "LOST"


class StoreError(Exception):
    """A metadata write or read that did not happen."""


class StoreUnavailable(StoreError):
    """No usable session: not started, not connected (SUSPENDED/LOST), or the request timed out."""


class StaleVersion(StoreError):
    """A compare-and-set lost: the znode changed (or vanished) since the version the writer read."""


class NotController(StoreError):
    """The controller-epoch check failed: another controller was elected since this one's epoch."""


class TopicExists(StoreError):
    """The topic znode already exists."""


class UnknownTopic(StoreError):
    """The topic znode does not exist."""


class BrokerIdInUse(StoreError):
    """node.id is registered by a live broker under another session."""


class RequestTooLarge(StoreError):
    """A multi-op larger than ZooKeeper accepts in one request (jute.maxbuffer, 1 MB by default): ZooKeeper
    would drop the connection instead of answering. Sent in smaller steps where that is safe, refused otherwise."""


class NotStored(OSError):
    """An ACL, credential or quota change that did not reach ZooKeeper (no session, a request that timed out, a
    compare-and-set lost too many times in a row). An OSError, as the security stores' protocols say a failed
    store is (security/acl_store.py, credentials.py, quotas.py): the request answers UNKNOWN_SERVER_ERROR. After a
    timeout the change may still have been made; its notification then tells every broker."""


class ZkAuthError(StoreError):
    """ZooKeeper credentials that are missing, unreadable or refused (`zookeeper.set.acl`, the JAAS file's Client
    section): a broker stops at start rather than run unauthenticated (docs/security.md §9)."""
