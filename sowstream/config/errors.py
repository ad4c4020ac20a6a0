"""The one error a bad configuration raises, pointing at the file, the element and the problem."""

from __future__ import annotations

import logging
import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from sowstream.errors import SowstreamError

# A location inside a pydantic model, e.g. ("history", "window_ms").
Loc = tuple[str | int, ...]


class ConfigError(SowstreamError, ValueError):
    """A configuration file or text that cannot be used; ``str()`` is ``source: element: problem``.

    It is a ``ValueError`` (bad input) and a ``SowstreamError`` (so callers can catch every error
    sowstream raises on purpose in one place).
    """

    def __init__(self, *, source: str, element: str, problem: str) -> None:
        super().__init__(f"{source}: {element}: {problem}")
        self.source = source
        self.element = element
        self.problem = problem

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only __init__ defeats Exception's default pickling (it replays positional args).
        return (_rebuild, (self.source, self.element, self.problem))


def _rebuild(source: str, element: str, problem: str) -> ConfigError:
    return ConfigError(source=source, element=element, problem=problem)


class FieldProblem(ValueError):
    """Raised by a cross-field check to say which field the problem belongs to."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def from_validation_error(
    exc: ValidationError, *, source: str, element_of: Callable[[Loc], str]
) -> ConfigError:
    """The first problem pydantic found, as a ConfigError whose element ``element_of`` names."""
    first = exc.errors()[0]
    loc: Loc = tuple(first["loc"])
    cause = first.get("ctx", {}).get("error")
    if isinstance(cause, FieldProblem):
        loc = (*loc, cause.field)
    if isinstance(cause, Exception):
        problem = str(cause)
    elif first["type"] == "missing":
        problem = "is required"
    elif first["type"] == "extra_forbidden":
        problem = "unknown setting"
    else:
        problem = first["msg"]
    return ConfigError(source=source, element=element_of(loc), problem=problem)


def skip_or_raise(error: ConfigError, *, skip: bool, skipping: str) -> None:
    """Raise ``error``, or with ``skip`` log it as a warning saying what is left out instead."""
    if not skip:
        raise error
    logging.getLogger("sowstream.config").warning("%s; skipping %s", error, skipping)


def element_text(element: ET.Element, where: str, source: str) -> str:
    """An XML element's text, which must be present and not nested elements."""
    if len(element):
        raise ConfigError(
            source=source,
            element=where,
            problem=f"<{element.tag}> must hold text, not <{element[0].tag}>",
        )
    text = (element.text or "").strip()
    if not text:
        raise ConfigError(source=source, element=where, problem=f"<{element.tag}> is empty")
    return text


def child_texts(
    element: ET.Element,
    tag: str,
    where: str,
    source: str,
    like: str = "",
    *,
    required: bool = True,
) -> list[str]:
    """The texts of ``element``'s children, which must all be ``<tag>`` and, if ``required``,
    at least one (``<HashIndex>`` of ``<Key>``, ``<Enrichment>`` of ``<Field>``); ``like``
    shows one."""
    texts: list[str] = []
    for child in element:
        if child.tag != tag:
            raise ConfigError(
                source=source,
                element=f"{where}/{child.tag}",
                problem=f"<{element.tag}> holds only <{tag}> elements",
            )
        texts.append(element_text(child, f"{where}/{tag}[{len(texts) + 1}]", source))
    if required and not texts:
        example = f", like {like}" if like else ""
        raise ConfigError(
            source=source,
            element=where,
            problem=f"<{element.tag}> needs at least one <{tag}>{example}",
        )
    return texts
