#!/usr/bin/env bash
# The GPU half of the matrix, for a machine with an NVIDIA GPU and python3 with
# torch (CUDA build), cupy, numpy and pytest already installed (such as the
# device machine). Pure-Python needs travel as wheels in .whl/:
#   array-api-compat, hypothesis, sortedcontainers, attrs (see docs of the
#   device tool for the pip download line).
# Runs the suite on torch_cuda and cupy (a missing backend or device FAILS),
# then benchmarks/gpu.py. Results land in $OUT (or benchmarks/results/).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-benchmarks/results}"
mkdir -p "$out"

if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:$PWD/src"
else
  export PYTHONPATH="$PWD/src"
fi
export PYTHONUNBUFFERED=1

nvidia-smi -L
python3 -c "import torch, cupy; print('torch', torch.__version__, torch.cuda.get_device_name(0)); print('cupy', cupy.__version__)"

set +e
PORTATTN_BACKENDS=torch_cuda,cupy python3 -m pytest tests --ignore=tests/site -q -p no:cacheprovider \
  --junitxml="$out/gpu-tests.xml" 2>&1 | tee "$out/gpu-tests.log"
tests_rc=${PIPESTATUS[0]}
set -e

if [ -f benchmarks/gpu.py ]; then
  python3 benchmarks/gpu.py --out "$out/gpu.json" 2>&1 | tee "$out/gpu-bench.log"
fi
exit "$tests_rc"
