#!/usr/bin/env bash
# session 8 device call C: build, `pytest -m cuda tests`, sanitizer and profile_layer in both
# backward modes (PYG_DFGNN_BACKWARD=store | recompute).  Usage: bash scripts/gpu_session8_modes.sh OUT
set -u
OUT=$1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYG_DFGNN_CACHE=/tmp/dfgnn_cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s)
python -c "import pyg_dfgnn._build as b; b.load()" > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
timeout 240 python -m pytest -q -m cuda tests -p no:cacheprovider > $OUT/pytest_cuda.log 2>&1
echo "cuda tests: $(tail -1 $OUT/pytest_cuda.log)  ($(( $(date +%s) - t0 )) s)"
grep -E "^(FAILED|ERROR)" $OUT/pytest_cuda.log | head -8
for m in recompute store; do
  PYG_DFGNN_BACKWARD=$m timeout 120 compute-sanitizer --tool memcheck python scripts/sanitizer_smoke.py > /tmp/sanitizer_$m.log 2>&1
  echo "sanitizer $m: $(grep -E 'ERROR SUMMARY' /tmp/sanitizer_$m.log | tail -1)"
done
for spec in transformer:8x10 gatv2:4x64 gat:8x19; do for dt in fp32 bf16; do for m in store recompute; do
  PYG_DFGNN_BACKWARD=$m timeout 40 python scripts/profile_layer.py --layer ${spec%%:*} --shape ${spec##*:} --dtype $dt --rows 4 2>/dev/null | grep -E "==.*forward\+backward|bwd_" | sed 's/(dfgnn::Params.*//; s/void dfgnn:://' | sed "s/^/$m /" >> $OUT/profile.log
done; done; done
cat $OUT/profile.log
echo "total $(( $(date +%s) - t0 )) s"
