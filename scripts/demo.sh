#!/usr/bin/env bash
# The main job, end to end on the local scheduler: serve, run twice, an actor program, status, stop.
set -euo pipefail
cd "$(dirname "$0")/.."
M=.venv/bin/monarch
trap '$M stop >/dev/null 2>&1 || true' EXIT
$M serve --hosts 2 --procs-per-host 2
$M run -- python -c 'import os; print("hello from", os.environ["MONARCH_HOSTNAME"], "node rank", os.environ["NODE_RANK"])'
$M run -- python -c 'print("second run, same hosts, no new allocation")'
$M run examples/actors.py
$M status
$M stop
