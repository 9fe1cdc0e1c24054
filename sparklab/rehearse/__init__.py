"""`sparklab rehearse`: the night of a sweep, tune or up, run against a DGX Spark twin (see night.py)."""
