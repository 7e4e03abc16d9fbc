#!/usr/bin/env bash
# Install what the tests need, then run the whole suite (this is what .ci/run calls).
#
# Twice over: the whole suite on .venv's Python (python3 on PATH), then the part that depends on how
# this Python pickles and signals (DEBIAN_TESTS) on Debian 12's own /usr/bin/python3 (3.11.2), the
# Python that the README's install gets on a fresh Debian machine: on it `signal.SIGTERM` pickled as a
# global that the wire refuses, and every signal to a run was dropped, while CI only ran 3.11.7.
# pyproject's requires-python names what these two cover.  With arguments (a part of the suite) only
# the first run is made, unless MONARCH_CI_DEBIAN=1; MONARCH_CI_DEBIAN=0 always skips the second.
set -euo pipefail
cd "$(dirname "$0")/.."
# Whatever ends this script (the suite's end, a failure, CI's timeout sending SIGTERM, Ctrl-C), what
# the tests started goes with it: every process they start inherits MONARCH_CI_RUN (the Slurm
# cluster's daemons, host agents, mounts' servers), and scripts/ci_cleanup.py stops those, then
# removes the FUSE mounts and network namespaces they left dead.  pytest runs in the background so
# that a signal is handled at once, not when pytest ends.
MONARCH_CI_RUN="test-$$-$(date +%s%N)"
export MONARCH_CI_RUN
ci_state=$(mktemp "${TMPDIR:-/tmp}/monarch-ci-XXXXXX")
python3 -P scripts/ci_cleanup.py snapshot "$ci_state" || true
child=
cleanup() {
  trap - TERM INT HUP
  python3 -P scripts/ci_cleanup.py clean "$ci_state" || true
  rm -f "$ci_state"
  # The default cluster too, should a test have started one there.
  scripts/slurm_cluster.sh stop >/dev/null 2>&1 || true
}
on_signal() { # NAME NUMBER
  echo "test.sh: $1: stopping the tests and cleaning up" >&2
  if [ -n "$child" ]; then kill -TERM "$child" 2>/dev/null || true; fi
  exit $((128 + $2))
}
trap cleanup EXIT
trap 'on_signal TERM 15' TERM
trap 'on_signal INT 2' INT
trap 'on_signal HUP 1' HUP
# "$@" in the background, waited for (a trap runs during `wait`, not during a foreground command).
# Without job control a background command starts with SIGINT and SIGQUIT ignored; tests/conftest.py
# gives the suite (and what it starts) the terminal's dispositions back, or no Ctrl-C test would work.
in_background() {
  "$@" &
  child=$!
  local rc=0
  wait "$child" || rc=$?
  child=
  return $rc
}
scripts/install.sh --test
# Lint and types first (pyproject's [tool.ruff] and [tool.mypy]): a finding fails the run before the suite.
.venv/bin/ruff check .
.venv/bin/mypy
DEBIAN_PY=/usr/bin/python3
# Every message type through the real wire; runs stopped by signals (first failure, Ctrl-C, SIGTERM,
# kill, timeouts); the fault tests; actor programs (pickled calls, supervision) end to end.
DEBIAN_TESTS=(
  tests/agents/test_message_values.py tests/agents/test_wire.py tests/agents/test_host_agent.py
  tests/agents/test_services.py tests/cli/test_exit_codes.py tests/cli/test_serve_run.py
  tests/cli/test_faults.py tests/monarch/test_actor_api.py tests/monarch/test_supervision.py
)
debian=0
if [ "${MONARCH_CI_DEBIAN:-$([ $# = 0 ] && echo 1 || echo 0)}" != 0 ] && [ -x "$DEBIAN_PY" ] \
   && [ "$("$DEBIAN_PY" -c 'import sys; print(sys.version)')" != "$(.venv/bin/python -c 'import sys; print(sys.version)')" ]; then
  PYTHON=$DEBIAN_PY VENV=.venv-debian scripts/install.sh --test
  debian=1
fi
set +e
in_background .venv/bin/python -m pytest -q --durations=15 "$@"
code=$?
if [ $debian = 1 ]; then
  echo "== on $("$DEBIAN_PY" --version) ($DEBIAN_PY): ${DEBIAN_TESTS[*]}"
  in_background .venv-debian/bin/python -m pytest -q -p no:cacheprovider --durations=5 "${DEBIAN_TESTS[@]}"
  dcode=$?
  [ $code = 0 ] && code=$dcode
fi
set -e
exit $code
