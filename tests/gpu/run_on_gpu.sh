#!/usr/bin/env bash
# Runs the tests that need a CUDA device on a machine that has one, with that machine's
# own python3 and torch, against an extension built elsewhere (an abi3 build: any CPython
# >= 3.10). Usage: tests/gpu/run_on_gpu.sh PATH/TO/_rust_bindings.abi3.so [OUTDIR]
# Writes junit XML, the logs and the DDP overlap bench's JSON to OUTDIR (default: a temp
# dir). No Rust toolchain needed. Steps, each bounded: the CUDA tests, the data-parallel
# overlap bench (4 procs on this machine's cores, reductions on a comms stream against on
# the main stream), then the CPU tensor and rdma suites as a cross-check.
set -uo pipefail
so=${1:?give the path of a built _rust_bindings.abi3.so}
out=${2:-$(mktemp -d)}
mkdir -p "$out"
root=$(cd "$(dirname "$0")/../.." && pwd)
cp "$so" "$root/python/monarch/_rust_bindings.abi3.so"
export PYTHONPATH="$root/python" PYTHONUNBUFFERED=1
cd "$root"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())'
rc=0
# The CUDA tests first (they must not be skipped here), then the CPU tensor and rdma
# suites on this machine as a cross-check.
timeout -k 10 240 python3 -m pytest -p no:cacheprovider -v -rs \
  tests/tensor/test_tensors_cuda.py tests/rdma/test_rdma_cuda.py tests/monitoring/test_gpu_monitoring.py \
  --junitxml="$out/cuda.xml" 2>&1 | tee "$out/cuda.log" || rc=1
grep -q " skipped\| SKIPPED" "$out/cuda.log" && { echo "a CUDA test was skipped on a GPU machine"; rc=1; }
# The overlap bench wants cores, not a GPU: with 4 procs on this machine's cores the
# reductions do not compete with the computation for them, as they do on 2 cores.
timeout -k 10 ${GPU_BENCH_LIMIT:-240} python3 benches/ddp_tensors_bench.py ${GPU_BENCH_ARGS:-} \
  --out "$out/ddp_tensors.json" 2>&1 | tee "$out/ddp.log" || rc=1
timeout -k 10 ${GPU_CPU_LIMIT:-240} python3 -m pytest -p no:cacheprovider -q -x \
  tests/tensor tests/rdma/test_rdma.py tests/monitoring/test_counters.py tests/monitoring/test_dashboard_live.py \
  --junitxml="$out/cpu.xml" 2>&1 | tail -40 | tee "$out/cpu.log" || rc=1
exit $rc
