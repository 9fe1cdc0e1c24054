#!/usr/bin/env bash
# Optional: the CPU vLLM image plus Debian's C++ compiler, so torch.compile works (no --enforce-eager):
#   sparklab/vllm-cpu:0.27.1-cc  (and 127.0.0.1:5000/sparklab/vllm-cpu:0.27.1-cc unless --no-push)
# = sparklab/vllm-cpu:0.27.1 (docker/vllm-cpu/build.sh) + apt-get install g++ python3-dev
#
# Only scripts/bench_engine_cache.py needs it (time to ready with compilation on, cold and warm engine
# caches); CI's default path does not build it. Nothing comes from a hub: apt reads the sources baked into
# sparklab/base:bookworm, which docker/base/build.sh gave mmdebstrap from this machine's own apt sources.
# The step runs the way build.sh runs its steps: `docker run` + `docker commit`.
#
# Usage: docker/vllm-cpu/build-cc.sh [--force] [--no-push]
# Env: SPARKLAB_CACHE (default ~/.cache/sparklab), SPARKLAB_REGISTRY (default 127.0.0.1:5000)
set -euo pipefail

VLLM_VERSION=0.27.1
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${SPARKLAB_CACHE:-$HOME/.cache/sparklab}"
REGISTRY="${SPARKLAB_REGISTRY:-127.0.0.1:5000}"
REPO=sparklab/vllm-cpu
SOURCE_LOCAL="$REPO:$VLLM_VERSION"
SOURCE="$REGISTRY/$REPO:$VLLM_VERSION"
LOCAL_IMAGE="$REPO:$VLLM_VERSION-cc"
IMAGE="$REGISTRY/$REPO:$VLLM_VERSION-cc"
LABEL=org.sparklab.vllm-cpu-cc.key
LOGS="$CACHE/logs"
TIMINGS="$CACHE/timings/vllm-cpu-cc-build.tsv"
PACKAGES="g++ python3-dev"  # Inductor's C++ kernels include <Python.h>
FORCE=0
PUSH=1

while [ $# -gt 0 ]; do
  case "$1" in
    --force) FORCE=1; shift ;;
    --no-push) PUSH=0; shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

say() { printf '[vllm-cpu-cc] %s\n' "$*"; }
die() { printf '[vllm-cpu-cc] ERROR: %s\n' "$*" >&2; exit 1; }
mkdir -p "$LOGS" "$(dirname "$TIMINGS")"
docker info >/dev/null 2>&1 || die "docker daemon not reachable (scripts/ci/setup-host.sh starts it)"

T0=$SECONDS
if ! docker image inspect "$SOURCE" >/dev/null 2>&1; then
  if docker image inspect "$SOURCE_LOCAL" >/dev/null 2>&1; then
    SOURCE="$SOURCE_LOCAL"
  else
    docker pull -q "$SOURCE" >/dev/null 2>&1 || die "no $SOURCE; run docker/vllm-cpu/build.sh first"
  fi
fi
SOURCE_ID="$(docker image inspect -f '{{.Id}}' "$SOURCE")"
KEY="$({ echo "$SOURCE_ID"; echo "$PACKAGES"; sha256sum "$HERE/build-cc.sh"; } | sha256sum | cut -c1-16)"

if [ "$FORCE" = 0 ] && [ "$(docker image inspect -f "{{ index .Config.Labels \"$LABEL\" }}" "$LOCAL_IMAGE" \
      2>/dev/null || true)" = "$KEY" ]; then
  say "$LOCAL_IMAGE is current ($LABEL=$KEY)"
  if [ "$PUSH" = 1 ]; then docker tag "$LOCAL_IMAGE" "$IMAGE" && docker push -q "$IMAGE" >/dev/null; fi
  say "done in $((SECONDS - T0))s"
  exit 0
fi

c="sparklab-vllm-cpu-cc-$$"
trap 'docker rm -f "$c" >/dev/null 2>&1 || true' EXIT
say "apt-get install $PACKAGES into $SOURCE (the image's own apt sources, from the host's) -> $LOCAL_IMAGE"
# Check-Valid-Until: the machine's mirror may serve a dated snapshot (docker/base/build.sh does the same).
if ! docker run --name "$c" --entrypoint sh "$SOURCE" -c "set -eu
  export DEBIAN_FRONTEND=noninteractive
  apt-get -q -o Acquire::Check-Valid-Until=false update
  apt-get -q -y --no-install-recommends install $PACKAGES
  rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
  g++ --version | head -n1" >"$LOGS/vllm-cpu-cc.log" 2>&1; then
  tail -n 30 "$LOGS/vllm-cpu-cc.log" >&2; die "apt-get install failed (log: $LOGS/vllm-cpu-cc.log)"
fi
tail -n 1 "$LOGS/vllm-cpu-cc.log"
# `--entrypoint sh` above would otherwise become the image's entrypoint: restore the source image's.
docker commit \
  --change 'ENTRYPOINT ["/usr/local/bin/vllm", "serve"]' \
  --change 'CMD []' \
  --change "LABEL $LABEL=$KEY" \
  "$c" "$LOCAL_IMAGE" >/dev/null
docker rm "$c" >/dev/null
docker tag "$LOCAL_IMAGE" "$IMAGE"
printf '%s\tinstall+commit\t%ss\n' "$(date -u +%FT%TZ)" "$((SECONDS - T0))" >>"$TIMINGS"
if [ "$PUSH" = 1 ]; then
  t=$SECONDS
  docker push -q "$IMAGE" >/dev/null
  printf '%s\tpush\t%ss\n' "$(date -u +%FT%TZ)" "$((SECONDS - t))" >>"$TIMINGS"
fi
size="$(docker image inspect -f '{{.Size}}' "$LOCAL_IMAGE")"
say "done in $((SECONDS - T0))s: $LOCAL_IMAGE ($((size / 1000000)) MB)"
