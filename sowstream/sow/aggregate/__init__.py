"""Aggregated SOW queries: the ``grouping=[...]`` and ``projection=[...]`` options of ``sow``.

An aggregated query groups the records that match its filter by the ``grouping`` fields and
returns one record per group, built from the ``projection`` entries::

    grouping=[/description]
    projection=[/description, COUNT(/id) AS /count, SUM(/qty * /px) AS /notional]

The records of a topic are spread over partitions that live on different workers, and only the
client sees every partition's answer. So aggregation is split in three steps:

* :meth:`Aggregation.partial` runs on each worker over its partition's matching records and
  yields :data:`Partials`: per group, a small JSON-able state per aggregate (a count, an exact sum
  and its count, a distinct set, a current minimum, ...). It travels in the Kafka replies.
* :func:`merge_partials` combines any number of partials. It is associative and commutative (and
  exact: sums are kept as exact binary fractions), so the answer does not depend on how records
  are spread over partitions, in which order replies arrive, or how merges are nested.
* :meth:`Aggregation.finish` turns merged partials into the output records. ``AVG`` is the merged
  sum over the merged count here, never an average of per-partition averages.

Rules, where AMPS's documentation leaves a choice open:

* NULL (a missing field, JSON ``null``, ``""``: the filter language's rule) is skipped by every
  aggregate. A path that crosses arrays reads several values, and each non-NULL one counts, so
  ``SUM(/legs/qty)`` adds up every leg. A group with no value left gives ``COUNT`` 0 and NULL
  for the others.
* ``SUM`` and ``AVG`` read numbers and numeric strings as the filter's arithmetic does; other
  values, and NaN or infinities (which JSON cannot carry), are skipped. ``SUM`` of integers is an
  integer, otherwise a float, correctly rounded from the exact sum; ``AVG`` is always a float. A
  result integer too big for 64 bits comes out as a float, for the same reason.
* ``MIN`` and ``MAX`` follow OrderBy's value order: numbers (numeric strings read as numbers)
  before other strings, strings by code point; booleans and objects are skipped.
* ``COUNT_DISTINCT`` compares values by their canonical text, as hash indexes and SowKeys do:
  ``7``, ``7.0`` and ``"7"`` are one value, ``"7.0"`` another.
  ``DISTINCT_LIST(expr[, delimiter])`` (the chapters' distinct-values list) joins those
  distinct texts, numbers first in numeric order, with ``delimiter`` (default ``,``).
* ``STDDEV_POP`` and ``STDDEV_SAMP`` are computed from exact sums of values and squares and
  rounded once; ``STDDEV_SAMP`` of fewer than two numbers is NULL. ``ANY`` gives the value whose
  JSON text sorts first, so every partitioning gives the same one.
* ``IF`` and ``CRC32`` may be used in a projection (as in a view); the other functions kept for
  Preprocessing and Enrichment may not.
* Group keys are compared the same way; NULL forms a group of its own, as in SQL. A grouping path
  that reads several values groups by the list of its non-NULL values, so every record is in
  exactly one group. The output shows one of the group's spellings, chosen deterministically
  (numbers, then strings, booleans and the rest, each by JSON text).
* A path used outside any aggregate that is not a grouping field is allowed, as in AMPS: it
  reads one record of the group. Which one is unspecified but deterministic (one with the fewest
  NULLs among those paths, ties broken by their JSON text), and every such path in the projection
  reads the same record.
* A projected value that is NULL is left out of the output record. Output records come in the
  order of their group's values (OrderBy's order, NULL last); callers apply OrderBy and top_n.

The package, by concern: ``parsing`` (the options' text; each projection field is parsed by the
filter grammar), ``accumulators`` (each aggregate function's retractable state, merge and
result: shared with views and aggregated subscriptions), ``live`` (an aggregated subscription's
groups on one partition, kept up to date record by record), ``groups``
(group keys and spellings), ``layout`` (which slot feeds each output, and the output record:
shared with views) and ``aggregation`` (partial, merge, finish).
"""

from __future__ import annotations

from sowstream.filters.parser import mask_strings

from .accumulators import (
    ACCUMULATORS,
    AGGREGATE_FUNCTIONS,
    DEFAULT_DELIMITER,
    Accumulator,
    StateError,
    accumulator,
)
from .aggregation import Aggregation, Partials, merge_partials, parse_aggregation
from .groups import component_text, field_value, group_component, spelling_rank
from .layout import ProjectionLayout
from .numbers import finite_number, output_number
from .parsing import (
    PROJECTION_FUNCTIONS,
    AggregationError,
    parse_grouping_field,
    parse_projection_field,
)

# Views (sowstream.views) and SOW topic stages (sowstream.sow.enrich) read projection fields with
# this package's parser, and views group, spell and lay out values with its rules, so that an
# aggregated query and a view with the same projection give the same records.
__all__ = [
    "ACCUMULATORS",
    "AGGREGATE_FUNCTIONS",
    "DEFAULT_DELIMITER",
    "PROJECTION_FUNCTIONS",
    "Accumulator",
    "Aggregation",
    "AggregationError",
    "Partials",
    "ProjectionLayout",
    "StateError",
    "accumulator",
    "component_text",
    "field_value",
    "finite_number",
    "group_component",
    "mask_strings",  # sow.enrich reads it from here
    "merge_partials",
    "output_number",
    "parse_aggregation",
    "parse_grouping_field",
    "parse_projection_field",
    "spelling_rank",
]
