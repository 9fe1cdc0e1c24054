#!/usr/bin/env bash
# Start a sweep detached from the terminal (it survives logout), log to a file, and say how to follow,
# stop and resume it.   Usage: scripts/overnight.sh SWEEP.yaml [more `sparklab sweep` arguments]
set -euo pipefail

[ $# -ge 1 ] || { echo "usage: $0 SWEEP.yaml [sparklab sweep arguments...]" >&2; exit 2; }
SWEEP="$1"
shift
[ -f "$SWEEP" ] || { echo "no sweep file $SWEEP" >&2; exit 2; }
SPARKLAB="${SPARKLAB:-$(command -v sparklab || true)}"
[ -n "$SPARKLAB" ] || { echo "sparklab is not on PATH: run scripts/install.sh first" >&2; exit 2; }

RUNS="${SPARKLAB_RUNS:-runs}"
mkdir -p "$RUNS"
STAMP="$(date +%Y%m%d-%H%M%S)"
LOG="$RUNS/overnight-$(basename "$SWEEP" .yaml)-$STAMP.log"
PIDFILE="$RUNS/overnight-$(basename "$SWEEP" .yaml)-$STAMP.pid"

# setsid: a new session, so closing the terminal (SIGHUP) does not reach it; stdin from /dev/null.
setsid nohup "$SPARKLAB" sweep "$SWEEP" --runs-dir "$RUNS" "$@" >"$LOG" 2>&1 </dev/null &
echo $! >"$PIDFILE"

cat <<MSG
sweep started in the background (pid $(cat "$PIDFILE")); it keeps running after you log out.
  follow it:   tail -f $LOG
  servers:     sparklab ps
  stop it:     kill -TERM $(cat "$PIDFILE")    (the server is torn down; the run stays resumable)
  resume:      $0 $SWEEP $*    (running the same sweep again continues its newest run)
  results:     $RUNS/$(basename "$SWEEP" .yaml)-*/results.sqlite
MSG
