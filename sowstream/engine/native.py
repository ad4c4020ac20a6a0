"""The compiled fold (the ``sowstream_native`` package, built from ``native/``), and when it runs.

It folds a chunk of a JSON SOW topic's log records in Rust: decoding, SowKeys, delta merges,
expiration and the stored form, with the old values read through the worker's own store (no
second RocksDB in the process). What it does not reproduce exactly it declines at that record and
the Python fold (:class:`~sowstream.engine.apply.Applier`) goes on from there, so log order holds.
The Python fold stays the reference: ``engine.native: shadow`` runs both and counts differences.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, get_args

from sowstream.config.models import NativeMode, TopicConfig
from sowstream.engine.partition import Outcome
from sowstream.sow.compiled import CompiledTopic
from sowstream.sow.ops import RawRecord
from sowstream.sow.record import SowRecord
from sowstream.subscriptions.model import Change, Watched

log = logging.getLogger("sowstream.engine")

__all__ = ["NativeFold", "NativeMode", "default_mode", "digest", "load_native", "native_fold"]

MODES: tuple[str, ...] = get_args(NativeMode)
# Overrides the default mode of processors made without one (tests run the fold's own tests
# with it off this way; a worker's engine.native setting wins over it).
ENV = "SOWSTREAM_NATIVE"
MODULE = "sowstream_native"

# The kinds of op in a Chunk.fold result (native/src/lib.rs).
APPLIED, DEAD, REKEY, UNCHANGED = 0, 1, 2, 3

_loaded: dict[str, ModuleType | None] = {}


def load_native(name: str = MODULE) -> ModuleType | None:
    """The compiled fold's module, or None (logged once per process) when it is not installed."""
    if name in _loaded:
        return _loaded[name]
    try:
        module: ModuleType | None = importlib.import_module(name)
    except ImportError as exc:
        log.warning(
            "the compiled fold (%s) is not installed (%s): applying logs with the Python fold "
            "(install cargo and run make to build it)",
            name,
            exc,
        )
        module = None
    else:
        log.info("the compiled fold (%s) folds the logs of the SOW topics it covers", name)
    _loaded[name] = module
    return module


def default_mode() -> NativeMode:
    """The mode of a processor made without one: $SOWSTREAM_NATIVE, else ``on``."""
    value = os.environ.get(ENV, "on").strip().lower()
    if value not in MODES:
        raise ValueError(f"${ENV} must be one of {', '.join(MODES)}, got {value!r}")
    return value  # type: ignore[return-value]


def covers(compiled: CompiledTopic[TopicConfig]) -> bool:
    """Whether the compiled fold can fold this topic's records at all (per record it may still
    decline): a JSON SOW topic keyed by Key fields or by its publishers, without a KeyGenerator,
    Preprocessing, Enrichment, History, publish entitlements or a Pattern."""
    topic = compiled.definition
    return (
        topic.sow
        and topic.message_type == "json"
        and topic.pattern is None
        and topic.key_generator is None
        and topic.history is None
        and not topic.publish_filters
        and compiled.stages.preprocessing is None
        and compiled.stages.enrichment is None
        and all(path.startswith("/") for path in topic.keys)
    )


class NativeFold:
    """The compiled fold of one topic: what it needs of the topic, made once."""

    def __init__(self, module: ModuleType, compiled: CompiledTopic[TopicConfig]) -> None:
        topic = compiled.definition
        self.topic = topic
        self._chunk: Any = module.Chunk
        policy = topic.expiration
        default = policy.default_ms if policy.mode == "default" and policy.default_ms else None
        self._spec: tuple[str, str, list[str], bool, int | None, int | None] = (
            repr(topic.name),
            topic.key_domain_of(topic.name),
            list(topic.keys),
            topic.user_supplied_keys,
            default,
            None,
        )

    def panic_at(self, offset: int | None) -> None:
        """Test hook: make the Rust side panic while decoding the record at ``offset`` (or, for
        a negative value, while folding the record at ``-offset``); None turns it off."""
        self._spec = (*self._spec[:5], offset)

    def run(
        self,
        recs: Sequence[RawRecord],
        folded: int,
        load: Callable[[list[bytes]], list[SowRecord | bytes | None]],
        index_paths: list[str],
        watch_paths: Sequence[str] = (),
    ) -> tuple[
        int,
        list[tuple[Any, ...]],
        list[tuple[bytes, bytes | None, bool]],
        dict[bytes, SowRecord | bytes | None],
        list[Watched | None],
    ]:
        """Fold ``recs`` (records at or below ``folded`` are skipped): ``(declined_at, ops,
        writes, olds, watched)``. ``load`` reads the current records of the keys touched (a
        record, its stored form, or None); ``writes`` says per key whether the values at
        ``index_paths`` stayed the same; ``watched`` holds per op the scalars at ``watch_paths``
        before and after it (see :class:`~sowstream.subscriptions.model.Change`).

        A Rust panic arrives as ``pyo3_runtime.PanicException``; the caller catches it."""
        chunk = self._chunk(self._spec, recs if isinstance(recs, list) else list(recs), folded)
        keys = chunk.reads()
        found = load(keys)
        declined_at, ops, writes, watched = chunk.fold(found, index_paths, list(watch_paths))
        return declined_at, ops, writes, dict(zip(keys, found, strict=True)), watched


def native_fold(compiled: CompiledTopic[TopicConfig], mode: NativeMode) -> NativeFold | None:
    """The topic's compiled fold for ``mode`` (None: off, not installed, or a topic it does not
    cover)."""
    if mode == "off" or not covers(compiled):
        return None
    module = load_native()
    return NativeFold(module, compiled) if module is not None else None


def is_panic(exc: BaseException) -> bool:
    """Whether ``exc`` is a Rust panic (``pyo3_runtime.PanicException``, a BaseException)."""
    return type(exc).__name__ == "PanicException"


def digest(outcome: Outcome, taken: Callable[[Change], bool] | None = None) -> tuple[Any, ...]:
    """What a fold produced, comparable between the two folds: the store writes (the changelog
    records), the change events, acks, dead letters, re-keyed copies and queue hand-offs (the
    index entries are in the batch's changes, compared by the tests). ``taken``: compare only
    the events it keeps (the compiled fold skips those no subscription can take)."""

    def rec(r: SowRecord | None) -> tuple[Any, ...] | None:
        if r is None:
            return None
        return (r.sow_key, r.data, r.log_offset, r.log_timestamp, r.expiration)

    events = [c for c in outcome.events if taken(c)] if taken is not None else outcome.events
    encoded = outcome.encoded
    writes = [
        (k, encoded[k] if encoded is not None else (v.to_bytes() if v is not None else None))
        for k, v in outcome.overlay.items()
    ]
    last = outcome.last_record
    return (
        outcome.last,
        last.offset if last is not None else None,
        writes,
        [(k, rec(v)) for k, v in outcome.overlay.items()],
        [
            (c.sow_key, rec(c.before), rec(c.after), c.partition, c.offset, c.timestamp)
            for c in events
        ],
        [(c.reason, c.resent, c.seq) for c in events],
        [(a.record.offset, a.changed, a.status, a.reason, a.message) for a in outcome.acks],
        [(r.record.offset, r.error.reason, str(r.error), r.error.topic) for r in outcome.dead],
        [(k.sow_key, k.record.offset) for k in outcome.rekeys],
        [tuple(e) for e in outcome.enqueued],
    )
