#!/usr/bin/env bash
export BENCH_TIMEOUT=300 CUDAALL_TIMEOUT=300 TRAIN_TIMEOUT=300
bash scripts/gpu_session11.sh "$1" "cudaall sanitize bench train"
