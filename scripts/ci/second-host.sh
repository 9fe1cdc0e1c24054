#!/usr/bin/env bash
# A second Docker host on this machine for the multi-host tests, reached the way a second Spark is:
# `ssh://root@127.0.0.1:$PORT` through its own sshd, with a key made here.
#   bash scripts/ci/second-host.sh [up]     set up (idempotent) and start what is not running; print the env
#   bash scripts/ci/second-host.sh stop     stop THIS daemon only (by its pidfile); sshd stays
#   bash scripts/ci/second-host.sh status   exit 0 when the daemon answers through ssh
# The daemon has its own socket, data root, exec root, pidfile and cgroup parent, a default bridge of its own and no
# iptables rules, so it never touches the main daemon's networks: its containers use the host network, and sparklab
# gives this host its own port range. Its managed containerd lives under its exec root. Not `--bridge=none`: a
# daemon with its bridge disabled deletes the interface docker0 as it starts (moby 20.10 daemon/daemon_unix.go,
# removeDefaultBridgeInterface), and this one shares this machine's network namespace, so that took the main
# daemon's bridge away (tests/docker/test_hosts.py). Its bridge, made here: sl-host2 with 169.254.213.1/30, a
# link-local /30 that no other network routes (SPARKLAB_SECOND_HOST_BRIDGE and _BRIDGE_ADDR set others).
# The ssh key, host key, sshd config and known_hosts live in $CACHE/second-host; ~/.ssh/config gets one
# Include line whose block matches only 127.0.0.1 on this port. The key is locked to
# `docker system dial-stdio` against this daemon's socket (a forced command), which is all docker-py sends.
set -euo pipefail

CACHE="${SPARKLAB_CACHE:-$HOME/.cache/sparklab}"
DIR="$CACHE/second-host"
PORT="${SPARKLAB_SECOND_HOST_PORT:-22022}"
RUN=/run/sparklab-host2
DATA=/var/lib/sparklab-host2
SOCK="$RUN/docker.sock"
BRIDGE="${SPARKLAB_SECOND_HOST_BRIDGE:-sl-host2}"
BRIDGE_ADDR="${SPARKLAB_SECOND_HOST_BRIDGE_ADDR:-169.254.213.1/30}"
PIDFILE="$RUN/docker.pid"
IMAGE="${SPARKLAB_TEST_STANDIN_IMAGE:-127.0.0.1:5000/sparklab/standin:2}"
LOG_DIR="$CACHE/logs"
mkdir -p "$DIR" "$RUN" "$DATA" "$LOG_DIR"
chmod 700 "$DIR"

say() { printf '[second-host] %s\n' "$*" >&2; }
die() { printf '[second-host] ERROR: %s\n' "$*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "must run as root"

dockerd_pid() {  # the pid of THIS daemon, if it runs
  local pid
  pid="$(cat "$PIDFILE" 2>/dev/null || true)"
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "--pidfile $PIDFILE" \
    && echo "$pid"
}
local_docker() { DOCKER_HOST="unix://$SOCK" docker "$@"; }
wait_for() {  # wait_for SECONDS DESCRIPTION CMD...
  local secs=$1 what=$2 i
  shift 2
  for ((i = 0; i < secs * 4; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.25
  done
  die "$what not ready after ${secs}s"
}

case "${1:-up}" in
stop)
  pid="$(dockerd_pid || true)"
  if [ -z "$pid" ]; then say "daemon: not running"; exit 0; fi
  kill -TERM "$pid"
  for _ in $(seq 1 120); do [ -d "/proc/$pid" ] || break; sleep 0.25; done
  [ -d "/proc/$pid" ] && die "daemon $pid did not stop in 30 s"
  say "daemon: stopped ($pid)"
  exit 0
  ;;
status)
  DOCKER_HOST="ssh://root@127.0.0.1:$PORT" docker info >/dev/null 2>&1
  exit $?
  ;;
up) ;;
*) die "usage: $0 [up|stop|status]" ;;
esac

# --- packages --------------------------------------------------------------------------------------
if ! command -v sshd >/dev/null && [ ! -x /usr/sbin/sshd ]; then
  say "installing openssh-server"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server </dev/null >/dev/null \
    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server </dev/null; }
fi
command -v ssh >/dev/null || die "no ssh client (apt-get install openssh-client)"

# --- keys and configs (made once) ------------------------------------------------------------------
[ -f "$DIR/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C sparklab-second-host -f "$DIR/id_ed25519"
[ -f "$DIR/host_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C sparklab-second-host-hostkey -f "$DIR/host_ed25519"
printf 'command="DOCKER_HOST=unix://%s exec docker system dial-stdio",no-pty,no-agent-forwarding,no-X11-forwarding,no-port-forwarding %s\n' \
  "$SOCK" "$(cat "$DIR/id_ed25519.pub")" >"$DIR/authorized_keys"
printf '[127.0.0.1]:%s %s\n' "$PORT" "$(cut -d' ' -f1,2 "$DIR/host_ed25519.pub")" >"$DIR/known_hosts"
chmod 600 "$DIR/authorized_keys" "$DIR/known_hosts"
cat >"$DIR/sshd_config" <<EOF
Port $PORT
ListenAddress 127.0.0.1
HostKey $DIR/host_ed25519
PidFile $RUN/sshd.pid
AuthorizedKeysFile $DIR/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
StrictModes no
AllowTcpForwarding no
X11Forwarding no
LogLevel ERROR
EOF
cat >"$DIR/ssh_config" <<EOF
# sparklab's second test Docker host (scripts/ci/second-host.sh); matches only 127.0.0.1 port $PORT
Match host 127.0.0.1 exec "test %p = $PORT"
  IdentityFile $DIR/id_ed25519
  IdentitiesOnly yes
  UserKnownHostsFile $DIR/known_hosts
  StrictHostKeyChecking yes
  BatchMode yes
  ConnectTimeout 5
EOF
mkdir -p "$HOME/.ssh"
chmod 700 "$HOME/.ssh"
include="Include $DIR/ssh_config"
if ! grep -qxF "$include" "$HOME/.ssh/config" 2>/dev/null; then
  # Include must come before any Host block to apply everywhere
  { echo "$include"; cat "$HOME/.ssh/config" 2>/dev/null || true; } >"$HOME/.ssh/config.sparklab-new"
  mv "$HOME/.ssh/config.sparklab-new" "$HOME/.ssh/config"
  chmod 600 "$HOME/.ssh/config"
  say "added '$include' to ~/.ssh/config"
fi

# --- sshd ------------------------------------------------------------------------------------------
sshd_pid="$(cat "$RUN/sshd.pid" 2>/dev/null || true)"
if [ -n "$sshd_pid" ] && [ -d "/proc/$sshd_pid" ]; then
  kill -HUP "$sshd_pid"  # re-read the config written above
  say "sshd: running on 127.0.0.1:$PORT ($sshd_pid)"
else
  mkdir -p /run/sshd
  /usr/sbin/sshd -t -f "$DIR/sshd_config" || die "sshd config invalid"
  /usr/sbin/sshd -f "$DIR/sshd_config" -E "$LOG_DIR/second-host-sshd.log"
  say "sshd: started on 127.0.0.1:$PORT"
fi

# --- its bridge ------------------------------------------------------------------------------------
command -v ip >/dev/null || die "no ip command (apt-get install iproute2)"
if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
  ip link add name "$BRIDGE" type bridge || die "cannot make the bridge $BRIDGE (SPARKLAB_SECOND_HOST_BRIDGE names another)"
  say "bridge: made $BRIDGE"
fi
if ! ip -4 -o addr show dev "$BRIDGE" | grep -qF " ${BRIDGE_ADDR} "; then
  ip addr add "$BRIDGE_ADDR" dev "$BRIDGE" \
    || die "cannot give $BRIDGE the address $BRIDGE_ADDR (SPARKLAB_SECOND_HOST_BRIDGE_ADDR sets another)"
fi
ip link set "$BRIDGE" up

# --- dockerd ---------------------------------------------------------------------------------------
pid="$(dockerd_pid || true)"
if [ -n "$pid" ] && ! tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "--bridge=$BRIDGE "; then
  say "daemon: running ($pid) without its own bridge (an older second-host.sh started it); restarting it"
  bash "$0" stop
  pid=
fi
if [ -n "$pid" ]; then
  say "daemon: running ($pid)"
else
  rm -f "$SOCK"
  say "daemon: starting (log: $LOG_DIR/second-host-dockerd.log)"
  setsid nohup dockerd --host "unix://$SOCK" --data-root "$DATA" --exec-root "$RUN/exec" --pidfile "$PIDFILE" \
    --bridge="$BRIDGE" --iptables=false --ip6tables=false --ip-forward=false --ip-masq=false \
    --cgroup-parent=sparklab-host2 >>"$LOG_DIR/second-host-dockerd.log" 2>&1 </dev/null &
  disown || true
fi
wait_for 60 "the second daemon" local_docker info
wait_for 30 "the second daemon through ssh" env DOCKER_HOST="ssh://root@127.0.0.1:$PORT" docker version

# --- the stand-in image, from the local registry (127.0.0.0/8 is an insecure registry by default) --
if ! local_docker image inspect "$IMAGE" >/dev/null 2>&1 || [ "$(local_docker image inspect -f '{{index .RepoDigests 0}}' "$IMAGE")" != \
  "$(docker image inspect -f '{{index .RepoDigests 0}}' "$IMAGE" 2>/dev/null || echo none)" ]; then
  local_docker pull -q "$IMAGE" >/dev/null
  say "image: pulled $IMAGE"
else
  say "image: $IMAGE present"
fi
echo "SPARKLAB_TEST_SECOND_HOST=ssh://root@127.0.0.1:$PORT"
