#!/usr/bin/env bash
# Print the GPU inventory the llmgw agent would report on this machine.
#
# Runs NVML discovery (`llmgw agent --gpus nvml --print-inventory`) on whatever
# NVIDIA GPUs exist: index, placement class, memory, health (critical XIDs,
# uncorrectable ECC) and UUID, then the same as one JSON line. Needs nothing
# but the project: it makes .venv and installs the project there if missing.
# Without an NVIDIA driver or GPU it prints one line saying so and exits 2.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c 'import llmgw, pynvml' 2>/dev/null; then
  .venv/bin/python -m pip install -q --disable-pip-version-check -e .
fi

if command -v nvidia-smi >/dev/null 2>&1; then
  echo "== nvidia-smi"
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv || true
  echo
fi
echo "== llmgw agent --gpus nvml --print-inventory"
exec .venv/bin/python -m llmgw agent --gpus nvml --print-inventory
