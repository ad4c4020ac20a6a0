"""The AMPS-style content-filter language: parse once, evaluate against parsed JSON records.

``compile_filter(text).matches(record)`` is the everyday entry point; ``parse_filter`` gives the
backend-neutral AST (``sowstream.filters.ast``) that other backends compile from.
"""

from __future__ import annotations

from . import ast
from .evaluate import Filter, compile_filter, compile_predicate, compile_value
from .parser import FilterError, parse_filter

__all__ = [
    "Filter",
    "FilterError",
    "ast",
    "compile_filter",
    "compile_predicate",
    "compile_value",
    "parse_filter",
]
