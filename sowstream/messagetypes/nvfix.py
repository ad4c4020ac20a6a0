"""``nvfix``: name=value fields separated by SOH, FIX's layout with names instead of tags."""

from __future__ import annotations

from typing import ClassVar

from sowstream.messagetypes._tagvalue import TagValueType


class NvfixType(TagValueType):
    """NVFIX: any name without ``=`` or SOH (``/OrderID`` reads ``OrderID=...``)."""

    name: ClassVar[str] = "nvfix"
