"""Configuration of topics beyond the declared ones: creation on first use, Pattern topics."""

from __future__ import annotations

import pytest

from sowstream.config import ConfigError
from sowstream.config import load_config_text as load
from sowstream.wire.topics import TopicNames


def test_undeclared_topics_are_created_by_default_and_can_be_refused() -> None:
    default = load("sow: []\n").engine
    assert default.auto_create_topics is True and default.auto_topic_partitions == 4
    strict = load("engine:\n  auto_create_topics: false\n  auto_topic_partitions: 8\n").engine
    assert strict.auto_create_topics is False and strict.auto_topic_partitions == 8


@pytest.mark.parametrize(
    ("text", "element", "problem"),
    [
        ("engine:\n  auto_create_topics: 'no'\n", "engine.auto_create_topics", "true or false"),
        ("engine:\n  auto_topic_partitions: 0\n", "engine.auto_topic_partitions", "between 1"),
    ],
)
def test_bad_auto_topic_settings_name_the_option(text: str, element: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load(text, "cfg.yaml")
    assert caught.value.element == element and problem in caught.value.problem


def test_the_shared_control_topic_cannot_be_a_topic_control_topic() -> None:
    names = TopicNames("p")
    assert names.auto_control == "p.ctl-auto"
    assert all(names.control(t) != names.auto_control for t in ("-auto", "ctl-auto", "auto"))
