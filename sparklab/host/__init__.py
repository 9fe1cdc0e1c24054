"""host: TODO."""
