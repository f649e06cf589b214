#!/usr/bin/env bash
# Multi-GPU training with DistributedDataParallel: the same command under torchrun.
# Graph data sets are sharded with a DistributedSampler (batch_size is per rank);
# full-batch Planetoid runs are replicated.  NCCL on CUDA, gloo on CPU.
#   examples/train_ddp.sh 4 configs/pattern_gat.yaml out_dir=runs/pattern_gat_ddp
set -euo pipefail
NPROC=${1:-2}; shift || true
CONFIG=${1:-configs/pattern_gat.yaml}; shift || true
exec torchrun --standalone --nproc-per-node="$NPROC" -m pyg_dfgnn train "$CONFIG" "$@"
