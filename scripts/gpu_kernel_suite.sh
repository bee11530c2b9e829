#!/usr/bin/env bash
# Runs the GPU kernel suite on a CUDA machine that has torch, triton, pytest and
# hypothesis but maybe neither SGLang nor network: wheels under .wheels-gpu/ (mmh3) are
# installed into a private target first (DETSPEC_GPU_SITE, else a temporary folder removed
# on exit). Usage: bash scripts/gpu_kernel_suite.sh [pytest args]
# Without a CUDA GPU (or torch, or Triton) nothing runs: test/registered/conftest.py says so
# and pytest exits with status 5.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${DETSPEC_PYTHON:-python3}
site=${DETSPEC_GPU_SITE:-}
if ls .wheels-gpu/*.whl >/dev/null 2>&1; then
  if [ -z "$site" ]; then
    site=$(mktemp -d)
    trap 'rm -rf "$site"' EXIT
  fi
  "$python" -m pip install -q --no-index --no-deps --no-compile --target "$site" .wheels-gpu/*.whl
fi
export PYTHONPATH="$PWD/python${site:+:$site}${PYTHONPATH:+:$PYTHONPATH}"
# -rA: every test named with its outcome in the closing summary, so a log shows what ran, not only dots.
"$python" -m pytest test/registered/cuda -q -rA -p no:cacheprovider "$@"
