#!/usr/bin/env bash
# Build the sparklab stand-in engine image on the local base image (no pull) and push it to the local
# registry as 127.0.0.1:5000/sparklab/standin:2 (plus a content tag :h-<hash>); SPARKLAB_STANDIN_TAG=T
# pushes :T instead of :2 (:2 added bin/ray and the two-node mode; :1 is the image before it).
# Skips everything when the registry already holds an image built from the same docker/standin contents
# and the same base image.
#
# Usage: docker/standin/build.sh [--force]
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
REPO_ROOT="$(cd "$HERE/../.." && pwd)"
REGISTRY="${SPARKLAB_REGISTRY:-127.0.0.1:5000}"
NAME="sparklab/standin"
STABLE_TAG="${SPARKLAB_STANDIN_TAG:-2}"  # another tag lets a branch test its own stand-in beside :2
BASE_IMAGE="sparklab/base:bookworm"
FORCE=0
[ "${1:-}" = "--force" ] && FORCE=1

say() { printf '[standin] %s\n' "$*"; }
die() { printf '[standin] ERROR: %s\n' "$*" >&2; exit 1; }

# The base image must exist (instant when it is up to date).
bash "$REPO_ROOT/docker/base/build.sh"
base_id="$(docker image inspect -f '{{.Id}}' "$BASE_IMAGE")"

# Content hash: every file under docker/standin (path, mode, bytes) + the base image id.
hash="$(
  cd "$HERE"
  {
    echo "base $base_id"
    find . -type f ! -name '*.pyc' ! -path '*/__pycache__/*' -print0 | LC_ALL=C sort -z |
      while IFS= read -r -d '' f; do
        printf '%s %s %s\n' "$f" "$(stat -c %a "$f")" "$(sha256sum <"$f" | cut -c1-64)"
      done
  } | sha256sum | cut -c1-16
)"
HASH_REF="$REGISTRY/$NAME:h-$hash"
STABLE_REF="$REGISTRY/$NAME:$STABLE_TAG"

# Digest of a tag in the registry (empty when absent).
remote_digest() {
  curl -fsSI --max-time 5 \
    -H 'Accept: application/vnd.docker.distribution.manifest.v2+json' \
    "http://$REGISTRY/v2/$NAME/manifests/$1" 2>/dev/null |
    awk -F': ' 'tolower($1) == "docker-content-digest" { gsub(/\r/, "", $2); print $2 }' || true
}

curl -fsS --max-time 5 -o /dev/null "http://$REGISTRY/v2/" 2>/dev/null ||
  die "registry $REGISTRY not answering (run scripts/ci/setup-host.sh)"

hash_digest="$(remote_digest "h-$hash")"
if [ "$FORCE" -eq 0 ] && [ -n "$hash_digest" ] && [ "$hash_digest" = "$(remote_digest "$STABLE_TAG")" ]; then
  # Make sure the local daemon has it too (tests run it from the registry ref; a pull is local and fast).
  if ! docker image inspect "$STABLE_REF" >/dev/null 2>&1; then
    docker pull -q "$STABLE_REF" >/dev/null
  fi
  say "$STABLE_REF is up to date (h-$hash, $hash_digest); nothing to do"
  exit 0
fi

start=$SECONDS
if [ "$FORCE" -eq 1 ] || ! docker image inspect "$HASH_REF" >/dev/null 2>&1; then
  say "building $HASH_REF (no pull)"
  # Legacy builder: no buildx needed; --pull=false so FROM resolves to the local base image only.
  if ! out="$(DOCKER_BUILDKIT=0 docker build -q --pull=false \
      --label "org.sparklab.standin.hash=$hash" \
      -t "$HASH_REF" -t "$STABLE_REF" "$HERE" 2>&1)"; then
    printf '%s\n' "$out" >&2
    die "docker build failed"
  fi
else
  docker tag "$HASH_REF" "$STABLE_REF"
fi
build_s=$((SECONDS - start))

start=$SECONDS
docker push -q "$HASH_REF" >/dev/null
docker push -q "$STABLE_REF" >/dev/null
say "built in ${build_s}s, pushed in $((SECONDS - start))s: $STABLE_REF (= $HASH_REF)"

# Drop local tags of older builds (the registry keeps them; they are small layers on the shared base).
docker images --format '{{.Repository}}:{{.Tag}}' "$REGISTRY/$NAME" | grep -F ":h-" | grep -vxF "$HASH_REF" |
  xargs -r docker rmi -f >/dev/null 2>&1 || true
