#!/usr/bin/env bash
# Start a sweep detached from the terminal (it survives logout), log to a file, and say how to follow,
# stop and resume it.   Usage: scripts/overnight.sh SWEEP.yaml [more `sparklab sweep` arguments]
#
# If sparklab itself dies (killed, a crash sparklab could not contain), the sweep is resumed, at most
# SPARKLAB_OVERNIGHT_RETRIES times (default 3), SPARKLAB_OVERNIGHT_PAUSE seconds apart (default 30). It is
# not resumed when it ends as planned: finished (0), finished with failed cells (6), stopped for a full disk
# (7), interrupted by Ctrl-C/SIGTERM (130), a bad sweep file or preflight (2, 3), or another sweep holds the
# run (1, "in use by pid N").
set -euo pipefail

[ $# -ge 1 ] || { echo "usage: $0 SWEEP.yaml [sparklab sweep arguments...]" >&2; exit 2; }
SWEEP="$1"
shift
[ -f "$SWEEP" ] || { echo "no sweep file $SWEEP" >&2; exit 2; }
SPARKLAB="${SPARKLAB:-$(command -v sparklab || true)}"
[ -n "$SPARKLAB" ] || { echo "sparklab is not on PATH: run scripts/install.sh first" >&2; exit 2; }

RUNS="${SPARKLAB_RUNS:-runs}"
RETRIES="${SPARKLAB_OVERNIGHT_RETRIES:-3}"
PAUSE="${SPARKLAB_OVERNIGHT_PAUSE:-30}"
mkdir -p "$RUNS"
STAMP="$(date +%Y%m%d-%H%M%S)"
LOG="$RUNS/overnight-$(basename "$SWEEP" .yaml)-$STAMP.log"
PIDFILE="$RUNS/overnight-$(basename "$SWEEP" .yaml)-$STAMP.pid"

# The loop runs in a new session (setsid: closing the terminal's SIGHUP does not reach it), stdin from
# /dev/null. SIGTERM to the loop's pid is passed on to the sweep, which tears its server down.
# shellcheck disable=SC2016
setsid nohup bash -c '
  sparklab=$1 sweep=$2 runs=$3 retries=$4 pause=$5; shift 5
  child=
  trap '\''[ -n "$child" ] && kill -TERM "$child" 2>/dev/null; wait; exit 143'\'' TERM INT
  tries=0
  while :; do
    "$sparklab" sweep "$sweep" --runs-dir "$runs" "$@" </dev/null & child=$!
    rc=0; wait "$child" || rc=$?
    case $rc in
      0|1|2|3|6|7|130|143) echo "overnight: sparklab sweep ended with exit code $rc"; exit "$rc" ;;
    esac
    tries=$((tries + 1))
    if [ "$tries" -gt "$retries" ]; then
      echo "overnight: sparklab sweep died with exit code $rc $tries times; giving up (resume: run this again)"
      exit "$rc"
    fi
    echo "overnight: sparklab sweep died with exit code $rc; resuming in $pause s (retry $tries of $retries)"
    sleep "$pause"
    args=(); for a in "$@"; do [ "$a" = --new ] || args+=("$a"); done  # resume the run, never a new one
    set -- ${args[@]+"${args[@]}"}
  done
' overnight "$SPARKLAB" "$SWEEP" "$RUNS" "$RETRIES" "$PAUSE" "$@" >"$LOG" 2>&1 </dev/null &
echo $! >"$PIDFILE"

cat <<MSG
sweep started in the background (pid $(cat "$PIDFILE")); it keeps running after you log out.
  follow it:   tail -f $LOG
  servers:     sparklab ps
  stop it:     kill -TERM $(cat "$PIDFILE")    (the server is torn down; the run stays resumable)
  resume:      $0 $SWEEP $*    (running the same sweep again continues its newest run)
  results:     $RUNS/$(basename "$SWEEP" .yaml)-*/results.sqlite
MSG
