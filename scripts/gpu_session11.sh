#!/usr/bin/env bash
# Session 11 device call: build this tree (and the variants / the base checkout
# in _carry/base, each in its own cache, in parallel), then the parts asked for:
#   tests    - the float64-reference kernel tests (every shape, fp32/bf16/fp16,
#              edge features, dropout, split rows, both backward modes, fuzz,
#              large logits)
#   extra    - `pytest -m cuda $EXTRA_TESTS` (the tests of this session's change)
#   cudaall  - the whole `pytest -m cuda tests`
#   ab       - per-kernel GPU time of fused layers (scripts/kernel_ab.py) for
#              base (_carry/base, if carried), this tree, and VARIANTS
#              (';'-separated nvcc flag sets), ratios to base last
#   sanitize - compute-sanitizer memcheck on the smoke script
#   check    - an ad-hoc script _carry/bf16chk.py (not committed: carried with
#              `carry: ["_carry"]`) on this tree and on _carry/base; session 11
#              used it for bf16 GAT gradients against float64
#   mem      - scripts/memory_layer.py $MEM_ARGS on this tree and on _carry/base
#   bench    - the layer shape x dtype matrix (dfgnn bench, no training)
#   benchab  - that matrix with $BENCH_ARGS (e.g. --layers transformer) for
#              _carry/base and this tree, alternated twice (base, new, base, new)
#   train    - dfgnn bench's training section alone (the shipped PATTERN paper
#              configs in fp32 and bf16, fused vs PyG; --graphs cora, whose
#              files are absent on the device, leaves the layer sections empty)
# Usage: bash scripts/gpu_session11.sh OUTDIR "tests ab"
# Logs are written to a work folder and packed into OUTDIR/s11.tgz at the end
# (the device tool brings back at most 8 files).
set -u
DEST=${1:-/tmp/s11}; PARTS=${2:-tests}
OUT=/tmp/s11_work; rm -rf "$OUT"; mkdir -p "$OUT" "$DEST"
trap 'cp "$OUT"/*compare*.txt "$DEST"/ 2>/dev/null; tar czf "$DEST/s11.tgz" -C "$OUT" .' EXIT
export PYTHONUNBUFFERED=1
ROOT=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
t0=$(date +%s)
has() { [[ " $PARTS " == *" $1 "* ]]; }
IFS=';' read -ra VS <<< "${VARIANTS:-}"
build() {  # dir cache extra log
  (cd "$1" && PYTHONPATH=$1 PYG_DFGNN_CACHE=$2 PYG_DFGNN_NVCC_EXTRA="$3" \
    python -c "import pyg_dfgnn._build as b; b.load()" > "$4" 2>&1)
}
pids=()
build "$ROOT" /tmp/dfgnn_new "" "$OUT/build_new.log" & pids+=($!)
if has ab || has check || has mem || has benchab; then
  [ -d _carry/base ] && { build "$ROOT/_carry/base" /tmp/dfgnn_base "" "$OUT/build_base.log" & pids+=($!); }
  for i in "${!VS[@]}"; do
    build "$ROOT" /tmp/dfgnn_var$i "${VS[$i]}" "$OUT/build_var$i.log" & pids+=($!)
  done
fi
rc=0; for p in "${pids[@]}"; do wait "$p" || rc=1; done
echo "builds: $(( $(date +%s) - t0 )) s rc=$rc"
[ $rc -eq 0 ] || { tail -30 "$OUT"/build_*.log; exit 1; }
export PYTHONPATH=$ROOT PYG_DFGNN_CACHE=/tmp/dfgnn_new
if has tests; then
  timeout ${TESTS_TIMEOUT:-300} python -m pytest -q -m cuda tests/ops/test_cuda_kernels.py \
    tests/ops/test_cuda_shapes.py tests/nn/test_fuzz.py tests/nn/test_large_logits.py tests/nn/test_glue.py \
    tests/ops/test_key_scale.py tests/nn/test_agnn_conv.py \
    -p no:cacheprovider > "$OUT/pytest_kernels.log" 2>&1
  echo "kernel tests: $(tail -1 "$OUT/pytest_kernels.log")"
  grep -E "^(FAILED|ERROR)" "$OUT/pytest_kernels.log" | head -8
fi
if has extra; then   # EXTRA_TESTS: test paths of this session's changes
  timeout ${EXTRA_TIMEOUT:-300} python -m pytest -q -m cuda ${EXTRA_TESTS:-tests/ops} \
    -p no:cacheprovider > "$OUT/pytest_extra.log" 2>&1
  echo "extra tests: $(tail -1 "$OUT/pytest_extra.log")"
  grep -E "^(FAILED|ERROR)" "$OUT/pytest_extra.log" | head -8
fi
if has cudaall; then
  timeout ${CUDAALL_TIMEOUT:-420} python -m pytest -q -m cuda tests -p no:cacheprovider \
    > "$OUT/pytest_cuda.log" 2>&1
  echo "cuda tests: $(tail -1 "$OUT/pytest_cuda.log")"
  grep -E "^(FAILED|ERROR)" "$OUT/pytest_cuda.log" | head -8
fi
if has sanitize; then
  timeout 240 compute-sanitizer --tool memcheck python scripts/sanitizer_smoke.py \
    > "$OUT/sanitizer.log" 2>&1
  echo "sanitizer: $(grep -E 'ERROR SUMMARY' "$OUT/sanitizer.log" | tail -1)"
fi
if has ab; then
  AB_ARGS=${AB_ARGS:-}
  files=()
  if [ -d _carry/base ]; then
    (cd _carry/base && PYTHONPATH=$ROOT/_carry/base PYG_DFGNN_CACHE=/tmp/dfgnn_base \
      timeout 200 python scripts/kernel_ab.py $AB_ARGS --out "$OUT/ab_base.jsonl") > "$OUT/ab_base.log" 2>&1
    files+=("$OUT/ab_base.jsonl")
  fi
  timeout 200 python scripts/kernel_ab.py $AB_ARGS --out "$OUT/ab_new.jsonl" > "$OUT/ab_new.log" 2>&1
  files+=("$OUT/ab_new.jsonl")
  for i in "${!VS[@]}"; do
    PYG_DFGNN_CACHE=/tmp/dfgnn_var$i PYG_DFGNN_NVCC_EXTRA="${VS[$i]}" timeout 200 \
      python scripts/kernel_ab.py $AB_ARGS --out "$OUT/ab_var$i.jsonl" > "$OUT/ab_var$i.log" 2>&1
    files+=("$OUT/ab_var$i.jsonl")
  done
  python scripts/kernel_ab.py --compare "${files[@]}" > "$OUT/ab_compare.txt" 2>&1
  grep -A60 "median ratio" "$OUT/ab_compare.txt"
  grep -l "Traceback" "$OUT"/ab_*.log | head -5
fi
if has mem; then
  # where the forward+backward peak memory is (scripts/memory_layer.py $MEM_ARGS),
  # this tree, then _carry/base
  timeout 200 python scripts/memory_layer.py ${MEM_ARGS:-} > "$OUT/mem_new.txt" 2>&1
  grep "^== " "$OUT/mem_new.txt"
  if [ -d _carry/base ]; then
    (cd _carry/base && PYTHONPATH=$ROOT/_carry/base PYG_DFGNN_CACHE=/tmp/dfgnn_base \
      timeout 200 python $ROOT/scripts/memory_layer.py ${MEM_ARGS:-}) > "$OUT/mem_base.txt" 2>&1
    echo "(base)"; grep "^== " "$OUT/mem_base.txt"
  fi
fi
if has check && [ -f _carry/bf16chk.py ]; then
  # an ad-hoc script run on this tree and on _carry/base (_carry is not committed)
  echo "== this tree"; timeout 120 python _carry/bf16chk.py 2>&1 | grep -v Warn | tail -12
  if [ -d _carry/base ]; then
    echo "== base"; (cd _carry/base && PYTHONPATH=$ROOT/_carry/base PYG_DFGNN_CACHE=/tmp/dfgnn_base \
      timeout 120 python $ROOT/_carry/bf16chk.py 2>&1 | grep -v Warn | tail -12)
  fi
fi
if has bench; then
  timeout ${BENCH_TIMEOUT:-420} python -m pyg_dfgnn bench configs/bench_default.yaml --out "$OUT/bench" \
    --no-train --no-compile --no-plots --contenders fused,pyg \
    --graphs uniform_100k,powerlaw_100k,pattern_128 > "$OUT/bench.log" 2>&1
  echo "bench rc=$?"; tail -12 "$OUT/bench.log"
fi
if has benchab; then   # the layer matrix (BENCH_ARGS) for _carry/base and this tree, alternated
  for round in 1 2; do
    for tree in base new; do
      if [ $tree = base ]; then
        [ -d _carry/base ] || continue
        d=$ROOT/_carry/base; c=/tmp/dfgnn_base
      else
        d=$ROOT; c=/tmp/dfgnn_new
      fi
      (cd "$d" && PYTHONPATH=$d PYG_DFGNN_CACHE=$c timeout ${BENCH_TIMEOUT:-300} \
        python -m pyg_dfgnn bench "$ROOT/configs/bench_default.yaml" --out "$OUT/bench_${tree}_$round" \
        --no-train --no-compile --no-plots --contenders fused,pyg ${BENCH_ARGS:-}) \
        > "$OUT/bench_${tree}_$round.log" 2>&1
      echo "bench $tree round $round rc=$?"
    done
  done
fi
if has train; then
  timeout ${TRAIN_TIMEOUT:-400} python -m pyg_dfgnn bench configs/bench_default.yaml --graphs cora \
    --no-compile --no-plots --out "$OUT/benchtrain" > "$OUT/benchtrain.log" 2>&1
  echo "train bench rc=$?"; grep -iE "train|epoch|x " "$OUT/benchtrain.log" | tail -14
fi
echo "total: $(( $(date +%s) - t0 )) s"
