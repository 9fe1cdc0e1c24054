"""sweep: TODO."""
