"""The sowstream client."""

from sowstream.client.client import Client, TopicInfo
from sowstream.client.messages import Command, Message

__all__ = ["Client", "Command", "Message", "TopicInfo"]
