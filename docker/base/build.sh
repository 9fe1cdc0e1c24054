#!/usr/bin/env bash
# Build the local base image sparklab/base:bookworm WITHOUT pulling anything from a hub:
#   mmdebstrap (Debian bookworm from this machine's own apt mirror) -> rootfs tar -> docker import.
#
# Usage: docker/base/build.sh [--mirror URI] [--force]
#   --mirror URI   Debian mirror to use (default: read from /etc/apt/sources.list{,.d/*}; env SPARKLAB_APT_MIRROR)
#   --force        rebuild the rootfs tar and re-import even if cached
#
# Cache: ~/.cache/sparklab/base/rootfs-<key>.tar, keyed by package list + mirror + suites.
# The image carries the key in label org.sparklab.base.key; an image with the same key is left alone.
set -euo pipefail

IMAGE="${SPARKLAB_BASE_IMAGE:-sparklab/base:bookworm}"
SUITE=bookworm
PACKAGES="python3,python3-venv,ca-certificates,libnuma1,libtcmalloc-minimal4,procps"
CACHE="${SPARKLAB_CACHE:-$HOME/.cache/sparklab}/base"
MIRROR="${SPARKLAB_APT_MIRROR:-}"
FORCE=0

while [ $# -gt 0 ]; do
  case "$1" in
    --mirror) MIRROR="$2"; shift 2 ;;
    --mirror=*) MIRROR="${1#--mirror=}"; shift ;;
    --force) FORCE=1; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

say() { printf '[base] %s\n' "$*"; }
die() { printf '[base] ERROR: %s\n' "$*" >&2; exit 1; }

# Print "URI SUITE SIGNED_BY" for every deb source of the machine (one-line and deb822 formats).
apt_sources() {
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    awk '
      $1 == "deb" {
        opts = ""; i = 2
        if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) { opts = opts " " $i; i++ } opts = opts " " $i; i++ }
        sb = "-"; if (match(opts, /signed-by=[^] ]+/)) sb = substr(opts, RSTART + 10, RLENGTH - 10)
        print $i, $(i + 1), sb
      }' "$f"
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk '
      function flush() {
        if (types ~ /(^| )deb( |$)/ && enabled != "no" && uris != "")
          { n = split(uris, u, " "); m = split(suites, s, " ")
            for (a = 1; a <= n; a++) for (b = 1; b <= m; b++) print u[a], s[b], (sb == "" ? "-" : sb) }
        types = uris = suites = sb = enabled = ""
      }
      /^[ \t]*#/ { next }
      /^[ \t]*$/ { flush(); next }
      { key = tolower($1); sub(/:$/, "", key); $1 = ""; sub(/^ +/, "")
        if (key == "types") types = $0; else if (key == "uris") uris = $0
        else if (key == "suites") suites = $0; else if (key == "signed-by") sb = $0
        else if (key == "enabled") enabled = tolower($0) }
      END { flush() }' "$f"
  done
}

# Build the mmdebstrap mirror arguments: bookworm + bookworm-updates from the main mirror, bookworm-security
# from the machine's security source if it has one.
mirror_specs=()
if [ -n "$MIRROR" ]; then
  mirror_specs=("deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main")
else
  sources="$(apt_sources)"
  main_line="$(awk -v s="$SUITE" '$2 == s { print; exit }' <<<"$sources")"
  [ -n "$main_line" ] || die "no '$SUITE' source in the machine's apt configuration; pass --mirror URI"
  read -r uri _ sb <<<"$main_line"
  MIRROR="$uri"
  opt=""; [ "$sb" != "-" ] && [ "${sb:0:1}" = "/" ] && opt="[signed-by=$sb] "
  mirror_specs=("deb ${opt}$uri $SUITE main")
  for extra in "$SUITE-updates" "$SUITE-security"; do
    line="$(awk -v s="$extra" '$2 == s { print; exit }' <<<"$sources")"
    [ -n "$line" ] || continue
    read -r uri _ sb <<<"$line"
    opt=""; [ "$sb" != "-" ] && [ "${sb:0:1}" = "/" ] && opt="[signed-by=$sb] "
    mirror_specs+=("deb ${opt}$uri $extra main")
  done
fi

KEY="$(printf '%s\n' "v1" "$SUITE" "$PACKAGES" "${mirror_specs[@]}" | sha256sum | cut -c1-16)"
TAR="$CACHE/rootfs-$KEY.tar"

if [ "$FORCE" -eq 0 ] && [ "$(docker image inspect -f '{{index .Config.Labels "org.sparklab.base.key"}}' \
      "$IMAGE" 2>/dev/null || true)" = "$KEY" ]; then
  say "$IMAGE is up to date (key $KEY); nothing to do"
  exit 0
fi

mkdir -p "$CACHE"
if [ "$FORCE" -eq 1 ] || [ ! -s "$TAR" ]; then
  command -v mmdebstrap >/dev/null || die "mmdebstrap missing (run scripts/ci/setup-host.sh)"
  say "mmdebstrap $SUITE (packages: $PACKAGES) -> $TAR"
  for m in "${mirror_specs[@]}"; do say "  source: $m"; done
  start=$SECONDS
  tmp="$CACHE/.rootfs-$KEY.$$.tmp.tar"
  trap 'rm -rf "$tmp"' EXIT
  # Check-Valid-Until: the machine's mirror may serve a dated snapshot whose Release files have expired.
  mmdebstrap --quiet --format=tar --variant=apt --include="$PACKAGES" \
    --aptopt='Acquire::Check-Valid-Until "false"' \
    --aptopt='Acquire::Languages "none"' \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
    "$SUITE" "$tmp" "${mirror_specs[@]}"
  mv "$tmp" "$TAR"
  trap - EXIT
  # Keep only the current rootfs tar.
  find "$CACHE" -maxdepth 1 -name 'rootfs-*.tar' ! -name "rootfs-$KEY.tar" -exec rm -rf {} +
  say "rootfs built in $((SECONDS - start))s ($(du -h "$TAR" | cut -f1))"
else
  say "using cached rootfs $TAR"
fi

start=$SECONDS
docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change "LABEL org.sparklab.base.key=$KEY org.sparklab.base.packages=$PACKAGES" \
  --change 'CMD ["/bin/bash"]' \
  --message "sparklab base: mmdebstrap $SUITE ($PACKAGES)" \
  "$TAR" "$IMAGE" >/dev/null
say "imported $IMAGE in $((SECONDS - start))s (key $KEY)"
