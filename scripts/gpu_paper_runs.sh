#!/usr/bin/env bash
# Paper-setting training runs on the device (issue 12), one call each part.
# Usage: bash scripts/gpu_paper_runs.sh OUTDIR PART [MINUTES]
#   PART=gat : Cora GAT (fused, pyg), PATTERN GAT pyg (15 epochs, same seed) and
#              PATTERN GAT fused with cuda_graphs=true until convergence or MINUTES
#   PART=gt  : PATTERN GT fused cuda_graphs=true for MINUTES (checkpoints kept in
#              OUTDIR/gt_fused for a later resume: RESUME=path/to/checkpoint_last.pt)
#   PART=gt_pyg : PATTERN GT pyg, same seed, EPOCHS epochs
#   PART=gat500k : PATTERN GAT 500k (L=16, configs/pattern_gat_500k.yaml), fused,
#              cuda_graphs auto, for MINUTES (checkpoints in OUTDIR/gat500k_fused; RESUME as for gt)
#   PART=gat500k_pair : the same model, same seed, EPOCHS epochs with backend=pyg and then
#              backend=fused (the learning curves of both in one call)
# Writes OUTDIR/runs.tar.gz (results.json + train.log of each run) and summary.txt.
set -u
OUT=${1:?}; PART=${2:?}; MIN=${3:-5}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYG_DFGNN_CACHE=${PYG_DFGNN_CACHE:-/tmp/dfgnn_cache}
R=/tmp/paper_runs; mkdir -p "$R" "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/summary.txt"
t0=$(date +%s)
python -c "import pyg_dfgnn._build as b; b.load()" > "$R/build.log" 2>&1 || { tail -20 "$R/build.log"; exit 1; }
echo "build $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
COMMON="data.root=/tmp/dfgnn_data log.progress=false checkpoint.enabled=false"
run() {  # label config args...
  local label=$1 cfg=$2; shift 2
  local s=$(date +%s)
  python -m pyg_dfgnn train "configs/$cfg" out_dir="$R/$label" "$@" > "$R/$label.out" 2>&1
  echo "$label: exit $? in $(( $(date +%s) - s )) s | $(grep -E '^.*done|stopping' "$R/$label.out" | tail -1)" | tee -a "$OUT/summary.txt"
}
case "$PART" in
gat)
  # the raw Planetoid files: carried in ${CORA_RAW:-_carry/planetoid/Cora/raw} (not part of the repo)
  mkdir -p /tmp/planetoid/Cora && cp -r "${CORA_RAW:-_carry/planetoid/Cora/raw}" /tmp/planetoid/Cora/
  run cora_gat_fused cora_gat.yaml backend=fused data.root=/tmp/planetoid log.progress=false checkpoint.enabled=false
  run cora_gat_pyg cora_gat.yaml backend=pyg data.root=/tmp/planetoid log.progress=false checkpoint.enabled=false
  run pattern_gat_pyg pattern_gat.yaml backend=pyg epochs=${EPOCHS:-15} $COMMON
  run pattern_gat_fused pattern_gat.yaml backend=fused cuda_graphs=true time_limit_min=$MIN $COMMON
  ;;
gt)
  run pattern_gt_fused pattern_gt.yaml backend=fused cuda_graphs=true time_limit_min=$MIN \
    data.root=/tmp/dfgnn_data log.progress=false checkpoint.enabled=true ${RESUME:+resume=$RESUME}
  ;;
gat500k)
  run gat500k_fused pattern_gat_500k.yaml backend=fused time_limit_min=$MIN \
    data.root=/tmp/dfgnn_data log.progress=false checkpoint.enabled=true ${RESUME:+resume=$RESUME}
  ;;
gat500k_pair)
  run gat500k_pyg pattern_gat_500k.yaml backend=pyg epochs=${EPOCHS:-10} $COMMON
  run gat500k_fused_short pattern_gat_500k.yaml backend=fused epochs=${EPOCHS:-10} $COMMON
  ;;
gt_pyg)
  run pattern_gt_pyg pattern_gt.yaml backend=pyg epochs=${EPOCHS:-8} $COMMON
  ;;
esac
python - "$R" >> "$OUT/summary.txt" <<'PY'
import json, sys, pathlib
for d in sorted(p for p in pathlib.Path(sys.argv[1]).iterdir() if p.is_dir()):
    f = d / "results.json"
    if not f.is_file():
        continue
    r = json.loads(f.read_text()); h = r["history"]; m = r["metrics"]
    ts = sorted(x["epoch_time_s"] for x in h[1:] or h)
    print(f"{d.name}: {len(h)} epochs, median epoch {ts[len(ts)//2]:.2f}s, best epoch "
          f"{m.get('best_epoch')}, metrics {json.dumps(m)}, stop: {r.get('stop_reason')}")
PY
tar czf "$OUT/runs.tar.gz" -C "$R" $(cd "$R" && ls -d */results.json */train.log *.out 2>/dev/null) 2>/dev/null
[ "$PART" = gt ] && cp "$R/pattern_gt_fused/checkpoint_last.pt" "$OUT/" 2>/dev/null
[ "$PART" = gat500k ] && cp "$R/gat500k_fused/checkpoint_last.pt" "$OUT/" 2>/dev/null
cat "$OUT/summary.txt"; echo "total $(( $(date +%s) - t0 )) s"
