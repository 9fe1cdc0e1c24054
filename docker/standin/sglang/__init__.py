"""Stand-in `sglang` package: only `python3 -m sglang.launch_server` exists (sparklab test double)."""
