#!/usr/bin/env bash
# One device call: build the extension, run the CUDA tests, compute-sanitizer
# smoke, kernel benchmarks.  Usage: bash scripts/gpu_check.sh OUTDIR [pytest-args]
set -u
OUT=${1:-/tmp/gpu_out}; shift || true
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYG_DFGNN_CACHE=/tmp/dfgnn_cache
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
t0=$(date +%s)
python -m pyg_dfgnn build 2>&1 | tail -5 | tee "$OUT/build.log"
echo "build_seconds=$(( $(date +%s) - t0 ))" | tee -a "$OUT/build.log"
