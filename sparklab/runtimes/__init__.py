"""runtimes: TODO."""
