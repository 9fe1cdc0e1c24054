"""bench: TODO."""
