#!/usr/bin/env bash
# The main job, end to end on the local scheduler, in the current directory: serve 2 hosts, run a
# command on them twice (same agents, no new allocation), an actor program, logs, status, stop.
# Uses the venv scripts/install.sh made, without activating it.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [ ! -x "$ROOT/.venv/bin/monarch" ]; then
  echo "demo: $ROOT/.venv/bin/monarch is missing; run scripts/install.sh first" >&2
  exit 1
fi
# Not activated on purpose: the agents still run `python` (and torchrun) from the venv.
monarch() { "$ROOT/.venv/bin/monarch" "$@"; }
trap 'monarch stop >/dev/null 2>&1 || true' EXIT
set -x
monarch serve --hosts 2 --procs-per-host 2
monarch run -- python -c 'import os; print("hello from", os.environ["MONARCH_HOSTNAME"], "node rank", os.environ["NODE_RANK"])'
monarch run -- python -c 'print("second run, same hosts, no new allocation")'
monarch run "$ROOT/examples/actors.py"
monarch logs --list
monarch status
monarch stop
{ set +x; } 2>/dev/null
echo
echo "demo done. To type \`monarch\` yourself, activate the venv:"
echo "  source $ROOT/.venv/bin/activate"
echo "then: monarch serve --hosts 2 && monarch run -- torchrun --nproc-per-node=2 $ROOT/examples/train_ddp.py"
