# shellcheck shell=bash
# How scripts/test.sh runs pytest: one step in the foreground, one lane in the background beside it, and how both
# stop when the script ends early. Sourced, not run: the caller sets VENV (the test venv) and keeps pytest_rc.
# tests/process/test_test_lanes.py runs these functions as test.sh does, started the way CI starts it.

pytest_rc=0
# Each failed test, said by tests/conftest.py as it fails in any pytest below, and printed last by failures_said.
SPARKLAB_TEST_FAILURES=$(mktemp)
export SPARKLAB_TEST_FAILURES
failures_said() {  # print each failed test once (its line, the start of its message) as the run's last lines
  if [ -s "$SPARKLAB_TEST_FAILURES" ]; then
    printf '[test] failed (%s):\n' "$(grep -c '^[^ ]' "$SPARKLAB_TEST_FAILURES")"
    sed 's/^/[test]   /' "$SPARKLAB_TEST_FAILURES"
  fi
  rm -f "$SPARKLAB_TEST_FAILURES"
}
pytest_step() {  # pytest_step PYTEST-ARGS...: run pytest, keep its first failing exit status in pytest_rc
  local rc=0
  "$VENV/bin/python" -m pytest -ra -q --durations=15 "$@" || rc=$?
  if [ "$rc" -eq 5 ]; then
    echo "[test] FAIL: pytest collected no tests (exit 5)" >&2
  fi
  if [ "$pytest_rc" -eq 0 ]; then pytest_rc=$rc; fi
}

lane_pid= lane_log=
lane_start() {  # lane_start SUMMARY PYTEST-ARGS...: pytest in the background (one lane at a time), its output kept in
  # a file and printed by lane_wait; SUMMARY is the closing line's format, %s the lane's wall seconds
  local format=$1
  shift
  lane_log=$(mktemp)
  (
    start=$SECONDS pytest_rc=0
    # A signal to this subshell alone (`pkill -f scripts/test.sh` names every shell of the script, not their pytests)
    # must not end it before its pytest: that pytest would go on as an orphan the script's stop_tests no longer sees.
    # Caught, the signal waits for the pytest, which the script stops through its teardowns (a caught signal is not
    # passed on to the pytest: it starts with the default action, or its own handler).
    trap : TERM INT HUP
    pytest_step "$@"
    # shellcheck disable=SC2059  # the format is this script's own
    printf "[test] $format\n" "$((SECONDS - start))"
    exit "$pytest_rc"
  ) >"$lane_log" 2>&1 &
  lane_pid=$!
}
lane_output() {  # print what the background lane (the engine lane, later the rehearsal) wrote, once
  if [ -n "$lane_log" ]; then cat "$lane_log"; rm -f "$lane_log"; lane_log=; fi
}
lane_wait() {  # lane_wait: wait for the background lane, print its output, keep its failure in pytest_rc
  if [ -n "$lane_pid" ]; then
    local lane_rc=0
    wait "$lane_pid" || lane_rc=$?
    lane_pid=
    lane_output
    if [ "$pytest_rc" -eq 0 ]; then pytest_rc=$lane_rc; fi
  fi
}
descendants() {  # descendants PID: the pid of every process under PID (with this call's own, gone once it returns)
  local child
  for child in $(ps -o pid= --ppid "$1"); do
    echo "$child"
    descendants "$child"
  done
}
running() {  # running PID: the process is there and not a zombie waiting for its parent
  local state
  state=$(ps -o stat= -p "$1" 2>/dev/null) && [ "${state:0:1}" != Z ]
}
STOP_SECONDS=${SPARKLAB_TEST_STOP_SECONDS:-300}  # how long the tests get to tear down before they are killed
stop_tests() {  # the script ends early (a failure, SIGTERM, Ctrl-C): stop every pytest it started, the foreground
  # one and the lane, the way a terminal's Ctrl-C reaches its whole foreground group (each pytest, its xdist workers,
  # the CLIs its tests run), so their tests tear down what they started; then print what the lane wrote. CI starts
  # this script with SIGINT ignored, and so were they: tests/conftest.py makes Ctrl-C and SIGTERM stop pytest anyway.
  local pids pid waited=0
  pids=$(descendants $$)
  if [ -n "$pids" ]; then
    echo "[test] stopping: Ctrl-C to the tests still running; up to ${STOP_SECONDS}s for their teardowns" >&2
    # shellcheck disable=SC2086  # one pid per word
    kill -INT $pids 2>/dev/null || true
    for pid in $pids; do
      while running "$pid" && [ "$waited" -lt "$STOP_SECONDS" ]; do
        sleep 1
        waited=$((waited + 1))
      done
    done
    # what is left, the deepest first: a lane's subshell ends by itself once its pytest is gone (a second for it)
    for pid in $(echo "$pids" | tac); do
      for _ in 1 2 3 4 5 6 7 8 9 10; do running "$pid" || break; sleep 0.1; done
      if running "$pid"; then
        echo "[test] stopping: process $pid ($(ps -o args= -p "$pid" | cut -c1-80)) still running: killed" >&2
        kill -KILL "$pid" 2>/dev/null || true
      fi
    done
  fi
  if [ -n "$lane_pid" ]; then wait "$lane_pid" 2>/dev/null || true; fi
  lane_output
}
