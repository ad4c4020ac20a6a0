"""``fix``: FIX tag=value messages separated by SOH; paths are tags, as in ``/35`` or ``/55``."""

from __future__ import annotations

from typing import ClassVar

from sowstream.messagetypes._tagvalue import TagValueType


class FixType(TagValueType):
    """FIX: tags must be numbers. Values are text; numeric text compares and sums as numbers."""

    name: ClassVar[str] = "fix"
    numeric_names: ClassVar[bool] = True
