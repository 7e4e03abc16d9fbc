#!/usr/bin/env bash
# Install what the tests need, then run the whole suite (this is what .ci/run calls).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh --test
set +e
.venv/bin/python -m pytest -q --durations=15 "$@"
code=$?
set -e
# Never leave a Slurm cluster behind, even when tests fail.
scripts/slurm_cluster.sh stop >/dev/null 2>&1 || true
exit $code
