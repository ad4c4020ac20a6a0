"""The Kafka ACL layout that keeps clients of one engine apart on a shared cluster.

Every client principal may write commands, registrations and publishes, but never read the
topics they travel on (so nobody harvests another client's credentials there); it reads only
its own reply topics, which it names after itself (``Client(name="<principal>-...")``). The
engine's principal needs everything under the prefix (or is a super user). docs/deploy.md
explains the layout; :func:`client_acls` is its one definition, used by the tests too.
"""

from __future__ import annotations

# Their public home, confluent_kafka.admin, re-exports them without marking it for type checkers.
from confluent_kafka.admin._acl import AclBinding, AclOperation, AclPermissionType
from confluent_kafka.admin._resource import ResourcePatternType, ResourceType

from sowstream.wire.topics import TopicNames

_TOPIC, _GROUP = ResourceType.TOPIC, ResourceType.GROUP
_PREFIXED, _LITERAL = ResourcePatternType.PREFIXED, ResourcePatternType.LITERAL
_O = AclOperation


def client_acls(prefix: str, principal: str) -> list[AclBinding]:
    """ACLs for client principal ``principal`` of the engine under topic prefix ``prefix``."""
    names = TopicNames(prefix)
    user = f"User:{principal}"
    own_replies = names.reply(f"{principal}-")
    grants: list[tuple[ResourceType, str, ResourcePatternType, list[AclOperation]]] = [
        # its own reply topics: create, read, delete; and their consumer groups
        (_TOPIC, own_replies, _PREFIXED, [_O.CREATE, _O.DESCRIBE, _O.READ, _O.DELETE]),
        (_GROUP, own_replies, _PREFIXED, [_O.READ, _O.DESCRIBE]),
        (_GROUP, f"{principal}-", _PREFIXED, [_O.READ, _O.DESCRIBE]),
        # write-only: transaction logs, control topics, the subscription registry
        (_TOPIC, f"{prefix}.log.", _PREFIXED, [_O.WRITE, _O.DESCRIBE]),
        (_TOPIC, f"{prefix}.ctl", _PREFIXED, [_O.WRITE, _O.DESCRIBE]),
        (_TOPIC, names.subscriptions, _LITERAL, [_O.WRITE, _O.DESCRIBE]),
        # the topic definitions (no secrets in them)
        (_TOPIC, names.meta, _LITERAL, [_O.READ, _O.DESCRIBE]),
    ]
    return [
        AclBinding(kind, name, pattern, user, "*", op, AclPermissionType.ALLOW)
        for kind, name, pattern, ops in grants
        for op in ops
    ]
