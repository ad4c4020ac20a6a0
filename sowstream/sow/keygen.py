"""SowKey generators: user code that computes a record's SowKey (AMPS's ``KeyGenerator``).

A topic names its generator as ``package.module:callable`` (or the name of an entry point in the
``sowstream.key_generators`` group). The callable is a factory: sowstream calls it once with the
topic's ``Options`` (a dict of strings) and uses what it returns, a function from the parsed
record to its SowKey. Workers, clients (which route each publish by its SowKey) and the Spark
rebuild all load the same generator through :func:`load_key_generator`, so they agree on keys.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from functools import cache
from importlib.metadata import entry_points
from typing import Any

from sowstream.errors import InvalidMessageError
from sowstream.filters.values import canonical_text, is_null
from sowstream.sow.keys import MAX_USER_KEY_LENGTH, field_values

__all__ = [
    "ENTRY_POINT_GROUP",
    "KeyFunction",
    "KeyGeneratorError",
    "generate_sow_key",
    "joined",
    "load_key_generator",
]

ENTRY_POINT_GROUP = "sowstream.key_generators"

KeyFunction = Callable[[Mapping[str, Any]], str]


class KeyGeneratorError(ValueError):
    """A KeyGenerator cannot be loaded: the module, the callable or its Options are wrong."""


def load_key_generator(module: str, options: Mapping[str, str]) -> KeyFunction:
    """The key function ``module`` builds from ``options`` (loaded once per distinct pair)."""
    return _load(module, tuple(sorted(options.items())))


@cache
def _load(module: str, options: tuple[tuple[str, str], ...]) -> KeyFunction:
    factory = _resolve(module)
    try:
        made = factory(dict(options))
    except Exception as exc:  # user code: any failure is a configuration problem
        raise KeyGeneratorError(
            f"key generator {module!r} refused its Options {dict(options)!r}: {exc}"
        ) from exc
    if not callable(made):
        raise KeyGeneratorError(
            f"key generator {module!r} must return a function from a record to its SowKey, "
            f"got {type(made).__name__}"
        )
    function: KeyFunction = made
    return function


def _resolve(module: str) -> Callable[[dict[str, str]], Any]:
    text = module.strip()
    if ":" not in text:
        found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == text]
        if not found:
            native = (
                " (a native AMPS module cannot be loaded: write it in Python)"
                if (text.endswith((".so", ".dll")))
                else ""
            )
            raise KeyGeneratorError(
                f"key generator {module!r} is neither 'package.module:callable' nor the name of "
                f"an installed entry point in group {ENTRY_POINT_GROUP!r}{native}"
            )
        loaded: Any = found[0].load()
    else:
        path, _, attribute = text.partition(":")
        try:
            target: Any = importlib.import_module(path)
        except ImportError as exc:
            raise KeyGeneratorError(
                f"key generator {module!r}: module {path!r} cannot be imported: {exc}"
            ) from exc
        loaded = target
        for part in attribute.split("."):
            if not hasattr(loaded, part):
                raise KeyGeneratorError(f"key generator {module!r}: {path!r} has no {attribute!r}")
            loaded = getattr(loaded, part)
    if not callable(loaded):
        raise KeyGeneratorError(f"key generator {module!r} is not callable")
    factory: Callable[[dict[str, str]], Any] = loaded
    return factory


def generate_sow_key(
    topic: str, module: str, function: KeyFunction, record: Mapping[str, Any]
) -> str:
    """Run a topic's generator on one record; a failure rejects that message (dead letter)."""
    try:
        key = function(record)
    except InvalidMessageError:
        raise
    except Exception as exc:
        raise InvalidMessageError(
            f"topic {topic!r}: key generator {module!r} failed: {type(exc).__name__}: {exc}",
            topic=topic,
            reason="key_generator_failed",
        ) from exc
    if not isinstance(key, str) or not key or len(key) > MAX_USER_KEY_LENGTH:
        raise InvalidMessageError(
            f"topic {topic!r}: key generator {module!r} returned {key!r}; a SowKey is a "
            f"non-empty string of at most {MAX_USER_KEY_LENGTH} characters",
            topic=topic,
            reason="bad_sow_key",
        )
    return key


def joined(options: Mapping[str, str]) -> KeyFunction:
    """A readable SowKey: the values of ``Fields`` (comma-separated paths) joined by ``Separator``.

    ``{"Fields": "/desk,/id"}`` keys ``{"desk": "fx", "id": 7}`` as ``fx|7``: handy when people
    read keys in logs and tools, at the price of keys as long as the values.
    """
    fields = [f.strip() for f in options.get("Fields", "").split(",") if f.strip()]
    if not fields or not all(f.startswith("/") for f in fields):
        raise KeyGeneratorError(f"Fields must list paths such as '/desk,/id', got {options!r}")
    separator = options.get("Separator", "|")

    def key(record: Mapping[str, Any]) -> str:
        parts = []
        for path in fields:
            found = field_values(record, path)
            if not found or is_null(found[0]):
                raise ValueError(f"field {path} is missing")
            parts.append(canonical_text(found[0]))
        return separator.join(parts)

    return key
