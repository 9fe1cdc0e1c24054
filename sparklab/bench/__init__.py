"""bench: one measured load against one OpenAI-compatible endpoint, and the numbers it gives.

Owns the chat client (`client`, the only module that speaks OpenAI, over `sse`, its lean HTTP/1.1 stream reader),
the prompt sources (`workloads`), one benchmark cell (`cell`: warmup, the window, the engine's counters around
it; `ownthread` runs its blocking calls, never waited for once the cell is cut short) and the pure arithmetic over
request records (`metrics`: summaries, intervals, speedups). It may import the engine adapters (for their counters
and quirks), `records`, `outputs`, `spec`, `inputs` and `errors`; nothing about recipes, hosts, runtimes or sweeps.
See docs/architecture.md.
"""
