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
.venv/bin/python -m pytest -q --durations=15 "$@"
code=$?
if [ $debian = 1 ]; then
  echo "== on $("$DEBIAN_PY" --version) ($DEBIAN_PY): ${DEBIAN_TESTS[*]}"
  .venv-debian/bin/python -m pytest -q -p no:cacheprovider --durations=5 "${DEBIAN_TESTS[@]}"
  dcode=$?
  [ $code = 0 ] && code=$dcode
fi
set -e
# Never leave a Slurm cluster behind, even when tests fail.
scripts/slurm_cluster.sh stop >/dev/null 2>&1 || true
exit $code
