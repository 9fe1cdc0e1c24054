"""cli: TODO."""
