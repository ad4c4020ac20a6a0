"""The units a worker runs: SOW topics, queues, views, conflated topics (see units.base)."""
