"""tune: TODO."""
