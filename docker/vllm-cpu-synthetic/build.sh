#!/usr/bin/env bash
# Build and push the vLLM 0.27.1 CPU image with synthetic rejection sampling, from the CPU image itself:
#   127.0.0.1:5000/sparklab/vllm-cpu:0.27.1-synthetic
# = 127.0.0.1:5000/sparklab/vllm-cpu:0.27.1 (docker/vllm-cpu/build.sh)
#   + sparklab_cpu_synthetic.py in the venv's site-packages (cpu_synthetic.py: the Triton kernels' synthetic branch
#     in Python, vllm/v1/sample/rejection_sampler.py:745-756 and :805-827)
#   + vllm/utils/cpu_triton_utils.py routed to it in place of its two synthetic-mode asserts (:348, :387), only
#     while SPARKLAB_VLLM_CPU_SYNTHETIC=1 (patch_kernels.py); without the variable the image behaves as the stock one.
#   + its expand kernel (:408-422) routed to a fixed copy while SPARKLAB_VLLM_CPU_EXPAND_FIX=1: the stock one never
#     writes the float temperature and top_p it expands for drafted tokens, so drafting at temperature > 0 samples
#     with garbage (cpu_synthetic.py's expand() says where and what was read).
# Why: vLLM 0.27.1's CPU build asserts synthetic acceptance away, and `sparklab tune` is proven on acceptance
# profiles through it on this machine (recipes/cpu.yaml, engine vllm-cpu-synthetic; scripts/bench_tune_vs_grid.py).
#
# Usage: docker/vllm-cpu-synthetic/build.sh [--force] [--no-push]
# Skipped when the registry holds the tag with the same content label (a hash of this directory's files and the
# base image id). Nothing is pulled from a hub: the base comes from the local registry (or the local tag).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REGISTRY="${SPARKLAB_REGISTRY:-127.0.0.1:5000}"
BASE="$REGISTRY/sparklab/vllm-cpu:0.27.1"
IMAGE="$REGISTRY/sparklab/vllm-cpu:0.27.1-synthetic"
LABEL=org.sparklab.vllm-cpu-synthetic.content
SITE=/opt/vllm/lib/python3.11/site-packages
FORCE=0
PUSH=1
while [ $# -gt 0 ]; do
  case "$1" in
    --force) FORCE=1; shift ;;
    --no-push) PUSH=0; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
say() { printf '[vllm-cpu-synthetic] %s\n' "$*"; }
die() { printf '[vllm-cpu-synthetic] ERROR: %s\n' "$*" >&2; exit 1; }

docker image inspect "$BASE" >/dev/null 2>&1 || docker pull "$BASE" >/dev/null \
  || die "no $BASE: build it first (docker/vllm-cpu/build.sh)"
BASE_ID="$(docker image inspect -f '{{.Id}}' "$BASE")"
CONTENT="$( (cd "$HERE" && sha256sum build.sh cpu_synthetic.py patch_kernels.py; echo "$BASE_ID") | sha256sum | cut -c1-16)"

if [ "$FORCE" = 0 ] && docker pull "$IMAGE" >/dev/null 2>&1 \
    && [ "$(docker image inspect -f "{{index .Config.Labels \"$LABEL\"}}" "$IMAGE")" = "$CONTENT" ]; then
  say "$IMAGE is up to date ($CONTENT)"
  exit 0
fi

NAME="sparklab-vllm-cpu-synthetic-build-$$"
trap 'docker rm -f "$NAME" >/dev/null 2>&1 || true' EXIT
docker create --network none --name "$NAME" --entrypoint /opt/vllm/bin/python "$BASE" /tmp/patch_kernels.py >/dev/null
docker cp "$HERE/cpu_synthetic.py" "$NAME:$SITE/sparklab_cpu_synthetic.py"
docker cp "$HERE/patch_kernels.py" "$NAME:/tmp/patch_kernels.py"
docker start -a "$NAME"
docker commit \
  --change 'ENTRYPOINT ["/usr/local/bin/vllm", "serve"]' --change 'CMD []' \
  --change "LABEL $LABEL=$CONTENT org.sparklab.vllm-cpu-synthetic.base=$BASE_ID" \
  "$NAME" "$IMAGE" >/dev/null
say "built $IMAGE ($CONTENT)"
if [ "$PUSH" = 1 ]; then
  docker push "$IMAGE" >/dev/null
  say "pushed $IMAGE"
fi
