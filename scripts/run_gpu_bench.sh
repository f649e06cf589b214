#!/usr/bin/env bash
# Full GPU comparison suite (fused layers/ops vs native PyG), from a checkout:
#
#   bash scripts/run_gpu_bench.sh OUT_DIR [CONFIG] [extra `dfgnn bench` args ...]
#
# CONFIG defaults to configs/bench_default.yaml.  Writes into OUT_DIR:
#   info.txt (versions, GPU), build.log (CUDA extension build, cached),
#   bench.log (progress + full tables), results.csv / results.json / table.txt /
#   summary.txt, speedup_*.png / memory_*.png, train/ (training-run logs).
# The compact summary table is printed last.  Needs torch (CUDA), torch_geometric,
# matplotlib, pyyaml; torch_sparse is optional (its contender is reported n/a);
# no network access is needed.
set -uo pipefail

if [ $# -lt 1 ] || [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
CALLER=$(pwd)
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$1" || exit 2
OUT=$(cd "$1" && pwd)
shift
CONFIG="$ROOT/configs/bench_default.yaml"
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then   # a config path (not an option)
  case "$1" in
    /*) CONFIG=$1 ;;
    *) if [ -f "$CALLER/$1" ]; then CONFIG="$CALLER/$1"; else CONFIG="$ROOT/$1"; fi ;;
  esac
  shift
fi
cd "$ROOT" || exit 2
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export MPLBACKEND=Agg PYTHONUNBUFFERED=1
PY=${PYTHON:-python}

{
  echo "== environment"
  date -u +"%Y-%m-%dT%H:%M:%SZ"
  git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || true
  "$PY" -m pyg_dfgnn info
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>/dev/null \
    || echo "nvidia-smi not available"
} 2>&1 | tee "$OUT/info.txt"

echo "== building the CUDA extension (cached; not part of the timed suite)"
t0=$(date +%s)
if "$PY" -m pyg_dfgnn build 2>&1 | tee "$OUT/build.log"; then
  echo "build: $(( $(date +%s) - t0 ))s"
else
  echo "WARNING: the CUDA extension did not build (see $OUT/build.log);" \
       "the fused contenders will report errors"
fi

echo "== benchmark: $CONFIG"
t0=$(date +%s)
"$PY" -m pyg_dfgnn bench "$CONFIG" --out "$OUT" "$@" 2>&1 | tee "$OUT/bench.log"
rc=${PIPESTATUS[0]}
echo "bench: $(( $(date +%s) - t0 ))s, exit status $rc"

echo
echo "== summary ($OUT/summary.txt; full table in $OUT/table.txt)"
if [ -f "$OUT/results.json" ]; then
  "$PY" -m pyg_dfgnn bench --summary "$OUT"
else
  echo "no results.json was written"
fi
exit "$rc"
