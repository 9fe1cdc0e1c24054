"""host: this machine as the engines see it: memory on unified memory, the floor watchdog, free disk, the host checks
before a start (`preflight`), and model downloads into the Hugging Face cache (`downloads`).

It may import `recipes` (what a recipe asks of the host), `engines` (an engine's memory flags), `spec`, `inputs`
and `errors`; never the runtimes, sweeps or the command line. See docs/architecture.md.
"""
