#!/usr/bin/env bash
# Prepare a Debian 12 host (run as root) for sparklab's Docker tests:
#   - install docker.io, docker-registry, mmdebstrap from the machine's own apt sources (only if missing),
#     and chromium, which opens `sparklab report`'s HTML in a test
#   - start dockerd in the background if `docker info` fails (no systemd needed)
#   - start a local registry on 127.0.0.1:5000 as a host process (storage under ~/.cache/sparklab/registry)
# Idempotent: a re-run on a ready host only checks and prints status.
set -euo pipefail

CACHE="${SPARKLAB_CACHE:-$HOME/.cache/sparklab}"
LOG_DIR="$CACHE/logs"
REGISTRY_ADDR="127.0.0.1:5000"
REGISTRY_DIR="$CACHE/registry"
mkdir -p "$LOG_DIR" "$REGISTRY_DIR/data"

say() { printf '[setup-host] %s\n' "$*"; }
die() { printf '[setup-host] ERROR: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root"

# --- packages --------------------------------------------------------------------------------------
pkg_installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

missing=()
PACKAGES=(docker.io docker-registry mmdebstrap curl python3-venv chromium)
for p in "${PACKAGES[@]}"; do
  pkg_installed "$p" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  say "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" </dev/null
else
  say "packages present: ${PACKAGES[*]}"
fi

# --- dockerd ---------------------------------------------------------------------------------------
wait_for() {  # wait_for SECONDS DESCRIPTION CMD...
  local secs=$1 what=$2; shift 2
  local i
  for ((i = 0; i < secs * 2; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  die "$what not ready after ${secs}s"
}

MAIN_PIDFILE=/var/run/docker.pid  # this machine's daemon; the second test host's has its own (second-host.sh)
main_dockerd_pid() {  # the pid of this machine's dockerd, if it runs (not any process named dockerd)
  local pid
  pid="$(cat "$MAIN_PIDFILE" 2>/dev/null || true)"
  [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = dockerd ] && echo "$pid"
}
start_dockerd() {
  # containerd is started by dockerd itself when no system containerd is running.
  # setsid: detach from the caller's process group so stopping the caller does not stop the daemon.
  say "dockerd: starting (log: $LOG_DIR/dockerd.log)"
  setsid nohup dockerd >>"$LOG_DIR/dockerd.log" 2>&1 </dev/null &
  disown || true
  wait_for 60 "dockerd" docker info
  say "dockerd: ready ($(docker version -f '{{.Server.Version}}' 2>/dev/null || echo '?'))"
}

if docker info >/dev/null 2>&1; then
  say "dockerd: already running ($(docker version -f '{{.Server.Version}}' 2>/dev/null || echo '?'))"
elif [ -n "$(main_dockerd_pid || true)" ]; then
  say "dockerd: process exists but not answering yet; waiting"
  wait_for 60 "dockerd" docker info
else
  start_dockerd
fi

# dockerd makes its default bridge's interface (docker0) only as it starts, and a daemon started with --bridge=none
# deletes it (moby 20.10 daemon/daemon_unix.go, removeDefaultBridgeInterface): until this one restarts, no container
# runs on its default bridge ("could not find bridge docker0"), nor a `docker build` RUN step. Restart it then, when
# it runs no container; the second test host no longer does that (second-host.sh gives it a bridge of its own).
bridge="$(docker network inspect bridge -f '{{index .Options "com.docker.network.bridge.name"}}' 2>/dev/null || true)"
if [ -n "$bridge" ] && [ ! -e "/sys/class/net/$bridge" ]; then
  if [ -n "$(docker ps -q)" ]; then
    say "WARNING: dockerd's default bridge $bridge is gone and containers run; restart dockerd when they are done"
  else
    pid="$(main_dockerd_pid || true)"
    say "dockerd: its default bridge $bridge is gone; restarting it (pid ${pid:-?}, no container runs)"
    if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet docker 2>/dev/null; then
      systemctl restart docker  # systemd's daemon: restarted by systemd, not replaced by one of ours
      wait_for 60 "dockerd" docker info
    else
      if [ -n "$pid" ]; then
        kill -TERM "$pid"
        for _ in $(seq 1 120); do [ -d "/proc/$pid" ] || break; sleep 0.25; done
        [ -d "/proc/$pid" ] && die "dockerd $pid did not stop in 30 s"
      fi
      start_dockerd
    fi
    [ -e "/sys/class/net/$bridge" ] || die "dockerd restarted without its default bridge $bridge"
  fi
fi

# --- local registry --------------------------------------------------------------------------------
registry_up() { curl -fsS -o /dev/null --max-time 2 "http://$REGISTRY_ADDR/v2/" 2>/dev/null; }

if registry_up; then
  say "registry: already answering on http://$REGISTRY_ADDR/v2/"
else
  cat >"$REGISTRY_DIR/config.yml" <<YAML
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $REGISTRY_DIR/data
  delete:
    enabled: true
http:
  addr: $REGISTRY_ADDR
YAML
  say "registry: starting on $REGISTRY_ADDR (log: $LOG_DIR/registry.log, data: $REGISTRY_DIR/data)"
  setsid nohup docker-registry serve "$REGISTRY_DIR/config.yml" >>"$LOG_DIR/registry.log" 2>&1 </dev/null &
  disown || true
  wait_for 30 "registry on $REGISTRY_ADDR" registry_up
  say "registry: ready"
fi
