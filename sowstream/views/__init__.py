"""Maintained views (AMPS ``View``): projections, aggregates and joins kept up to date from the
underlying topics' changes. The pure core: compile (``projection``), retractable aggregate
states (``accumulators``), groups (``groups``), joins (``joins``) and the per-view
``maintainer``; the engine feeds it changes and publishes what it returns."""
