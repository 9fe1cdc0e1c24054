"""recipes: TODO."""
