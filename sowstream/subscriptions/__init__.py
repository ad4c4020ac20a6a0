"""Subscriptions: options, deltas, out-of-focus, conflation, pagination and filter indexing."""
