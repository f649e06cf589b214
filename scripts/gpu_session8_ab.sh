#!/usr/bin/env bash
# session 8 device call A: build, `pytest -m cuda tests`, sanitizer, then the layer bench and
# profile_layer on this tree and on _carry/base (a `git archive` of an older commit, carried to
# the device), and scripts/memory_graphed.py.  Usage: bash scripts/gpu_session8_ab.sh OUT
# (Run in session 8 when the column pass always recomputed; for the same today run it with
# PYG_DFGNN_BACKWARD=recompute.)
set -u
OUT=$1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYG_DFGNN_CACHE=/tmp/dfgnn_cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s)
python -c "import pyg_dfgnn._build as b; b.load()" > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
grep -i "spill" $OUT/build.log | head -3
echo "build $(( $(date +%s) - t0 )) s"
# base build in the background (CPU only)
(cd _carry/base && PYTHONPATH=$PWD PYG_DFGNN_CACHE=/tmp/dfgnn_cache_base python -c "import pyg_dfgnn._build as b; b.load()" > /tmp/base_build.log 2>&1; echo "base build rc $?" >> /tmp/base_build.log) &
timeout 240 python -m pytest -q -m cuda tests -p no:cacheprovider > $OUT/pytest_cuda.log 2>&1
echo "cuda tests: $(tail -1 $OUT/pytest_cuda.log)  ($(( $(date +%s) - t0 )) s)"
grep -E "^(FAILED|ERROR)" $OUT/pytest_cuda.log | head -8
timeout 150 compute-sanitizer --tool memcheck python scripts/sanitizer_smoke.py > /tmp/sanitizer.log 2>&1
echo "sanitizer: $(grep -E 'ERROR SUMMARY' /tmp/sanitizer.log | tail -1)"
wait
tail -1 /tmp/base_build.log
B="--no-train --no-compile --no-plots --graphs uniform_100k,powerlaw_100k,pattern_128 --warmup 2 --repeats 10"
timeout 200 python -m pyg_dfgnn bench configs/bench_default.yaml --out /tmp/bench_new --contenders fused,pyg $B > /tmp/bench_new.log 2>&1; echo "bench new rc=$? ($(( $(date +%s) - t0 )) s)"
(cd _carry/base && PYTHONPATH=$PWD PYG_DFGNN_CACHE=/tmp/dfgnn_cache_base timeout 120 python -m pyg_dfgnn bench configs/bench_default.yaml --out /tmp/bench_base --contenders fused $B > /tmp/bench_base.log 2>&1); echo "bench base rc=$? ($(( $(date +%s) - t0 )) s)"
cp /tmp/bench_new/results.json $OUT/bench_new.json; cp /tmp/bench_base/results.json $OUT/bench_base.json 2>/dev/null
for spec in transformer:8x10 gatv2:4x64; do for dt in fp32 bf16; do
  timeout 40 python scripts/profile_layer.py --layer ${spec%%:*} --shape ${spec##*:} --dtype $dt --rows 4 2>/dev/null | grep -E "==.*forward\+backward|dfgnn::" | sed 's/(dfgnn::Params.*//; s/void dfgnn:://' | sed "s/^/new  /" >> $OUT/profile.log
  (cd _carry/base && PYTHONPATH=$PWD PYG_DFGNN_CACHE=/tmp/dfgnn_cache_base timeout 40 python scripts/profile_layer.py --layer ${spec%%:*} --shape ${spec##*:} --dtype $dt --rows 4 2>/dev/null | grep -E "==.*forward\+backward|dfgnn::" | sed 's/(dfgnn::Params.*//; s/void dfgnn:://' | sed "s/^/base /") >> $OUT/profile.log
done; done
echo "profile done ($(( $(date +%s) - t0 )) s)"
C="epochs=2 checkpoint.enabled=false data.num_train=2000 data.num_val=400 data.num_test=400 data.root=/tmp/dfgnn_data log.progress=false"
timeout 100 python scripts/memory_graphed.py configs/pattern_gt.yaml $C backend=fused cuda_graphs=true out_dir=/tmp/r/new > $OUT/mem_new.log 2>&1; echo "mem rc=$?"
grep -E "==|stream 0x" $OUT/mem_new.log
cat $OUT/profile.log | head -60
echo "total $(( $(date +%s) - t0 )) s"
