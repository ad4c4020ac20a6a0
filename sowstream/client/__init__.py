"""The sowstream client."""

from sowstream.client.client import Client, TopicInfo
from sowstream.client.messages import Command, Message
from sowstream.client.queue import QueueSubscription
from sowstream.client.subscription import Subscription, SubscriptionDroppedError

__all__ = [
    "Client",
    "Command",
    "Message",
    "QueueSubscription",
    "Subscription",
    "SubscriptionDroppedError",
    "TopicInfo",
]
