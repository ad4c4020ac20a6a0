"""Every XML configuration example in the reference chapters (``shared/spec``, 01-08), loaded by
our AMPS XML loader as printed: each loads, or is refused where AMPS itself would refuse it (the
short list below, each with the chapter's reason), with a message naming the element.

The chapters are read where they are, not copied: an example added to a chapter and missing from
the lists below fails the walk, and so does a listed one the walk no longer finds.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from sowstream.config import ConfigError, load_config_text
from sowstream.views.projection import parse_join


def spec_dir() -> Path | None:
    """``$SOWSTREAM_SPEC_DIR``, else the first ``shared/spec`` above this checkout."""
    given = os.environ.get("SOWSTREAM_SPEC_DIR")
    if given:
        return Path(given)
    for parent in Path(__file__).resolve().parents:
        if (parent / "shared" / "spec").is_dir():
            return parent / "shared" / "spec"
    return None


SPEC = spec_dir()
pytestmark = pytest.mark.skipif(
    SPEC is None, reason="the reference chapters (shared/spec) are absent"
)

OPEN_OR_CLOSE = re.compile(r"<(/?)([A-Za-z_][\w.-]*)[^>]*?(/?)>")


@dataclass(frozen=True)
class Example:
    """One XML block of a chapter: where it starts and its text as printed."""

    chapter: str  # the file's two-digit number
    line: int
    text: str

    @property
    def id(self) -> str:
        return f"{self.chapter}:{self.line}"

    @property
    def top(self) -> str:
        """The name of its first element (comments skipped)."""
        found = re.search(r"<([A-Za-z_][\w.-]*)", re.sub(r"<!--.*?-->", "", self.text, flags=re.S))
        assert found is not None
        return found.group(1)


def xml_blocks(text: str) -> list[tuple[int, str]]:
    """The runs of XML lines in a chapter: from a line starting with ``<`` until the elements
    opened are closed and the next non-blank line is prose (or the text ends)."""
    lines = text.splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        if not lines[i].lstrip().startswith("<"):
            i += 1
            continue
        start, depth, in_comment, taken = i, 0, False, []
        while i < len(lines):
            line = lines[i]
            stripped = line.strip()
            if taken and depth == 0 and not in_comment and stripped[:1] not in ("", "<"):
                break
            taken.append(line)
            i += 1
            if in_comment:
                if "-->" not in line:
                    continue
                line, in_comment = line.split("-->", 1)[1], False
            line = re.sub(r"<!--.*?-->", "", line)
            if "<!--" in line:
                line, in_comment = line.split("<!--", 1)[0], True
            for tag in OPEN_OR_CLOSE.finditer(line):
                if not tag.group(3):
                    depth += -1 if tag.group(1) else 1
        blocks.append((start + 1, "\n".join(taken).rstrip()))
    return blocks


def examples() -> list[Example]:
    if SPEC is None:
        return []
    found = []
    for path in sorted(SPEC.glob("0[1-8]-*")):
        for line, text in xml_blocks(path.read_text()):
            found.append(Example(path.name[:2], line, text))
    return found


EXAMPLES = {e.id: e for e in examples()}

# Whole configurations, or SOW children given without their <SOW>: loaded as printed.
LOAD = {
    "01:204": "Example 7.1, topic expiration (fix, keys /55 and /109)",
    "01:217": "Example 7.2, expiration enabled",
    "01:307": "Example 7.3, a json and an xml topic",
    "05:754": "Example 9.2, the views (hash-sample-view warns of its index on /name)",
    "05:344": "the sales-reps bflat topic",
    "05:653": "the MQ queue over ORDERS_.*",
    "05:669": "the GroupQueue over ORDERS_.*",
}
# Refused as AMPS would refuse them: (element named, words of the problem, the reason).
REFUSE = {
    "01:106": (
        "SOW/Topic[custom-keyed-sow]/KeyGenerator/Module",
        "libmy_key_generator.so",
        # Chapter 01 loads the generator from a Modules/Module Library; AMPS does not start
        # when that library cannot be loaded, and a native AMPS module never can be here.
        "the module's Library is a native AMPS plug-in that does not exist here",
    ),
}
# SOW children over topics the listing does not show. As printed AMPS refuses them (chapter 05:
# a ConflatedTopic's UnderlyingTopic "must exactly match the name of a SOW topic"); with those
# topics declared, of the message type each names, they load.
COMPLETE = {
    "05:941": {
        "FastPublishTopic": ("nvfix", "json"),
        "TheRegexTopic": ("bflat",),
    },
}
COMPLETE_PENDING: dict[str, str] = {}
# Element fragments: each is placed in the smallest parent that takes it.
FRAGMENTS = {
    "01:70": "Key",
    "01:78": "Key",
    "05:579": "Priority",
    "05:583": "Priority",
    "05:593": "BarrierExpression",
    "07:162": "Join",
}
# Not configuration: a syntax template with placeholders ("expression AS /target").
TEMPLATES = {"08:193": "Preprocessing/Enrichment syntax (chapter 08, B2)"}


def as_document(example: Example) -> str:
    """The example as a configuration: SOW children get their <SOW>."""
    if example.top in ("AMPSConfig", "SOW"):
        return example.text
    return f"<SOW>\n{example.text}\n</SOW>"


def test_the_walk_finds_every_example_and_each_is_listed_once() -> None:
    listed = [*LOAD, *REFUSE, *COMPLETE, *FRAGMENTS, *TEMPLATES]
    assert len(listed) == len(set(listed))
    assert sorted(EXAMPLES) == sorted(listed), "a chapter gained or lost an XML example"


@pytest.mark.parametrize("ident", sorted(LOAD))
def test_an_example_loads_as_printed(ident: str) -> None:
    example = EXAMPLES[ident]
    config = load_config_text(as_document(example), f"spec {ident}")
    assert config.topics or config.views or config.queues or config.conflated_topics


@pytest.mark.parametrize("ident", sorted(REFUSE))
def test_an_example_amps_refuses_is_refused_naming_the_element(ident: str) -> None:
    element, problem, _reason = REFUSE[ident]
    with pytest.raises(ConfigError) as caught:
        load_config_text(as_document(EXAMPLES[ident]), f"spec {ident}")
    assert caught.value.source == f"spec {ident}"
    assert caught.value.element.startswith(element), str(caught.value)
    assert problem in caught.value.problem, str(caught.value)


def with_topics(children: str, topics: dict[str, tuple[str, ...]]) -> str:
    """SOW children after a declaration of each of ``topics`` in each of its message types."""
    declared = "".join(
        f"<Topic><Name>{name}</Name><MessageType>{kind}</MessageType><Key>/id</Key></Topic>"
        for name, kinds in topics.items()
        for kind in kinds
    )
    return f"<SOW>{declared}{children}</SOW>"


@pytest.mark.parametrize(
    "ident",
    [
        pytest.param(
            i, marks=pytest.mark.xfail(strict=True, reason=COMPLETE_PENDING[i], raises=ConfigError)
        )
        if i in COMPLETE_PENDING
        else i
        for i in COMPLETE
    ],
)
def test_sow_children_load_once_the_topics_they_read_are_declared(ident: str) -> None:
    load_config_text(with_topics(EXAMPLES[ident].text, COMPLETE[ident]), f"spec {ident}")


def test_the_conflated_topics_example_without_bflat() -> None:
    """Chapter 05's ConflatedTopic listing, its json and nvfix elements: refused as printed,
    naming the UnderlyingTopic, and loaded over the topics they read."""
    elements = re.findall(r"<ConflatedTopic>.*?</ConflatedTopic>", EXAMPLES["05:941"].text, re.S)
    kept = "".join(e for e in elements if "bflat" not in e)
    with pytest.raises(ConfigError) as caught:
        load_config_text(f"<SOW>{kept}</SOW>", "spec 05:941")
    assert caught.value.element == "SOW/ConflatedTopic[FastPublishTopic-C]/UnderlyingTopic"
    assert "'FastPublishTopic', which is not defined" in caught.value.problem
    config = load_config_text(
        with_topics(kept, {"FastPublishTopic": ("nvfix", "json")}), "spec 05:941"
    )
    assert [(c.name, c.message_type, c.interval_ms) for c in config.conflated_topics] == [
        ("FastPublishTopic-C", "nvfix", 5000),
        ("LongIntervalTopic-C", "json", 120000),
    ]
    assert config.conflated_topics[0].filter == "/region = 'A'"


def _fragment_documents(ident: str) -> list[str]:
    """The fragment placed in a parent: a Key in a topic, Priority or BarrierExpression in a
    queue over a declared topic, each Join line in a view over the topics it joins."""
    text = EXAMPLES[ident].text
    kind = FRAGMENTS[ident]
    if kind == "Key":
        return [f"<SOW><Topic><Name>t</Name><MessageType>json</MessageType>{text}</Topic></SOW>"]
    if kind in ("Priority", "BarrierExpression"):
        return [
            "<SOW><Topic><Name>orders</Name><Key>/id</Key></Topic><Queue><Name>q</Name>"
            f"<UnderlyingTopic>orders</UnderlyingTopic>{text}</Queue></SOW>"
        ]
    documents = []
    for line in text.splitlines():
        join = parse_join(re.sub(r"</?Join>", "", line.strip()))
        sides = (join.left, join.right)
        topics = "".join(
            f"<Topic><Name>{s.topic.topic}</Name>"
            f"<MessageType>{s.topic.message_type or 'json'}</MessageType>"
            f"<Key>{s.path}</Key></Topic>"
            for s in sides
        )
        left = line.split("<Join>", 1)[1].split("=", 1)[0].strip()
        documents.append(
            f"<SOW>{topics}<View><Name>joined</Name><UnderlyingTopic>{line.strip()}"
            f"</UnderlyingTopic><Projection><Field>{left} AS /k</Field>"
            f"<Field>COUNT({left}) AS /n</Field></Projection>"
            f"<Grouping><Field>{left}</Field></Grouping></View></SOW>"
        )
    return documents


@pytest.mark.parametrize("ident", sorted(FRAGMENTS))
def test_an_element_fragment_loads_in_its_parent(ident: str) -> None:
    example = EXAMPLES[ident]
    assert example.top == FRAGMENTS[ident]
    for document in _fragment_documents(ident):
        load_config_text(document, f"spec {ident}")


def test_the_templates_are_syntax_not_configuration() -> None:
    for ident in TEMPLATES:
        assert "expression AS /target" in EXAMPLES[ident].text
