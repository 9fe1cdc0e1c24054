"""tune: which speculative method and K to run at each concurrency, measuring as little as it can.

`search` is the pure decision (what to load next, when to stop, from the observations so far); `driver` runs it on
the sweep machinery. It may import `sweep` and everything below it; never `report` or `cli`. See
docs/architecture.md.
"""
