#!/usr/bin/env bash
# Install monarch and torch (the CPU wheel, for the torchrun examples) into ./.venv (idempotent).
# With --test, also what the test suite needs (TorchX, pytest, and a real Slurm via
# scripts/slurm_cluster.sh install).
# PYTHON picks the interpreter (default python3), VENV the folder (default .venv): CI also builds
# .venv-debian from Debian's /usr/bin/python3, the Python a fresh Debian 12 machine runs this with.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
# editable_mode=compat: a plain .pth path entry; the default mode installs an import hook
# (pathlib, re, fnmatch) that every Python start pays for (~20 ms of each `monarch run`).
EDITABLE=()
# Workspace mounts are FUSE (pyfuse3 compiles against libfuse3); rsync is the sync benchmark's baseline;
# the tests check the RDMA choice with Debian's pyverbs (there is no RDMA device here).
# python3-venv: Debian's python3 makes no venv without it (a fresh Debian 12 machine lacks it).
APT=(fuse3 libfuse3-dev pkg-config rsync python3-venv)
# The tests put hosts in network namespaces (`monarch serve --netns`): ip (iproute2), nsenter/unshare (util-linux);
# the dashboard's are checked in a real terminal (tmux) and its --web in a real headless browser (chromium).
[ "${1:-}" = "--test" ] && APT+=(python3-pyverbs iproute2 util-linux tmux chromium)
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && ! dpkg -s "${APT[@]}" >/dev/null 2>&1; then
  (apt-get update -qq || true) >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${APT[@]}" >/dev/null
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
# torch for every install (the README's torchrun examples need it), first and pinned: 2.13.0 is the
# local CPU wheel; anything looser pulls GBs of CUDA.
"$VENV"/bin/pip install -q torch==2.13.0
if [ "${1:-}" = "--test" ]; then
  "$VENV"/bin/pip install -q -e ".[test]" "${EDITABLE[@]}"
  if [ "$(id -u)" = 0 ]; then scripts/slurm_cluster.sh install; fi
elif pkg-config --exists fuse3 2>/dev/null; then
  "$VENV"/bin/pip install -q -e ".[fuse,torch]" "${EDITABLE[@]}"
else
  echo "note: libfuse3 is not installed; hosts will serve the workspace as a copied directory, not a FUSE mount" >&2
  "$VENV"/bin/pip install -q -e ".[torch]" "${EDITABLE[@]}"
fi
# Byte-compile once: with PYTHONDONTWRITEBYTECODE set, every command would recompile our sources.
"$VENV"/bin/python -m compileall -q monarch_agents monarch monarch_cli monarch_schedulers monarch_telemetry monarch_rdmafs >/dev/null
