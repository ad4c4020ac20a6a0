"""Which records a filter can touch: a direct key lookup, a hash-index lookup, or a full scan.

Exact-match and IN filters on exactly the Key fields become SowKey lookups (the implicit key
index); on exactly a HashIndex's fields they become index lookups; anything else scans.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sowstream.config.models import TopicConfig
from sowstream.filters import Filter
from sowstream.filters.index import equality_lookup
from sowstream.sow.keys import sow_key_from_values
from sowstream.sow.layout import index_entry_prefix


@dataclass(frozen=True)
class KeyLookup:
    """Read exactly these SowKeys."""

    sow_keys: tuple[str, ...]


@dataclass(frozen=True)
class IndexLookup:
    """Read the records under these hash-index entry prefixes."""

    index: int
    prefixes: tuple[bytes, ...]


@dataclass(frozen=True)
class FullScan:
    """Test every record."""


Plan = KeyLookup | IndexLookup | FullScan


def plan(topic: TopicConfig, flt: Filter | None, sow_keys: Sequence[str] | None = None) -> Plan:
    """The cheapest way to find the records ``flt`` (and ``sow_keys``) can match."""
    if sow_keys is not None:
        return KeyLookup(tuple(dict.fromkeys(sow_keys)))
    if flt is None:
        return FullScan()
    if topic.keys:
        combos = equality_lookup(flt.ast, topic.keys)
        if combos is not None:
            domain = topic.effective_key_domain
            return KeyLookup(tuple(dict.fromkeys(sow_key_from_values(domain, c) for c in combos)))
    for number, fields in enumerate(topic.hash_indexes):
        combos = equality_lookup(flt.ast, fields)
        if combos is not None:
            return IndexLookup(number, tuple(index_entry_prefix(number, c) for c in combos))
    return FullScan()
