#!/usr/bin/env bash
# The GPU half of the matrix, for a machine with an NVIDIA GPU and python3 with
# torch (CUDA build), cupy, numpy and pytest already installed (such as the
# device machine). Pure-Python needs travel as wheels in .whl/:
#   array-api-compat, hypothesis, sortedcontainers, attrs (see docs of the
#   device tool for the pip download line).
# Runs the default suite (nox's markers) on torch_cuda and cupy (a missing
# backend or device FAILS), then benchmarks/gpu.py. Results land in $OUT (or
# benchmarks/results/). Arguments go to benchmarks/gpu.py, e.g.
# `scripts/gpu-check.sh --max-n 8192 --rounds 3` to fit a short lease.
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

# The selection. The markers are nox's default ones: the large-N, cluster,
# Hugging Face model and inductor suites stay out, as in tests-torch-cuda.
# A test module that imports a library this machine may lack (none of them a
# backend: dask, distributed, jax, ndonnx, transformers, threadpoolctl) is left
# out by name, saying why, instead of failing the collection; a backend named
# in PORTATTN_BACKENDS that cannot run still fails (tests/conftest.py).
select=(--ignore=tests/site -m "not slow and not cluster and not models and not inductor and not parallel")
leave_out_unless() {  # leave_out_unless "MODULE, ..." TEST_FILE...
  local modules=$1
  shift
  if ! python3 -c "import $modules" 2>/dev/null; then
    for f in "$@"; do
      echo "leaving out $f: it imports $modules, not all importable here"
      select+=("--ignore=$f")
    done
  fi
}
leave_out_unless "dask" tests/test_dask.py
leave_out_unless "dask, distributed, psutil" tests/test_dask_cluster.py
leave_out_unless "dask, jax, ndonnx" tests/test_transforms.py
leave_out_unless "transformers" tests/test_hf_attention.py tests/test_hf_models.py
leave_out_unless "threadpoolctl" tests/test_threads.py
if ! python3 -c "import dask" 2>/dev/null; then
  echo "leaving out test_dask_schedule_reads_the_graph_without_computing_it: no dask here"
  select+=(--deselect tests/test_testing.py::test_dask_schedule_reads_the_graph_without_computing_it)
fi
# Workers share the one GPU (pytest-benchmark refuses to run beside xdist).
if python3 -c "import xdist" 2>/dev/null; then
  select+=(-n 8 -p no:benchmark)
fi
# JAX is an oracle here, not a backend: keep it on the CPU, off the GPU's memory.
export JAX_PLATFORMS=cpu XLA_PYTHON_CLIENT_PREALLOCATE=false
# end of the selection

set +e
PORTATTN_BACKENDS=torch_cuda,cupy python3 -m pytest tests "${select[@]}" -q -p no:cacheprovider \
  --junitxml="$out/gpu-tests.xml" 2>&1 | tee "$out/gpu-tests.log"
tests_rc=${PIPESTATUS[0]}
set -e

if [ -f benchmarks/gpu.py ]; then
  python3 benchmarks/gpu.py --out "$out/gpu.json" "$@" 2>&1 | tee "$out/gpu-bench.log"
fi
exit "$tests_rc"
