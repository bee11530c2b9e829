#!/usr/bin/env bash
# Runs the GPU kernel suite on a CUDA machine that has torch, triton, pytest and
# hypothesis but maybe neither SGLang nor network: wheels under .wheels-gpu/ (mmh3) are
# installed into a private target first. Usage: bash scripts/gpu_kernel_suite.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
site=${DETSPEC_GPU_SITE:-$(mktemp -d)}
# A suite that skips everything must not pass as a GPU run.
"${DETSPEC_PYTHON:-python3}" -c "import torch, triton, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
  || { echo "gpu_kernel_suite: needs a CUDA GPU with torch and Triton" >&2; exit 1; }
if ls .wheels-gpu/*.whl >/dev/null 2>&1; then
  "${DETSPEC_PYTHON:-python3}" -m pip install -q --no-index --no-deps --no-compile --target "$site" .wheels-gpu/*.whl
fi
export PYTHONPATH="$PWD/python:$site${PYTHONPATH:+:$PYTHONPATH}"
"${DETSPEC_PYTHON:-python3}" -m pytest test/registered/cuda -q -p no:cacheprovider "$@"
