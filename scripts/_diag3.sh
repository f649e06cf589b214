#!/usr/bin/env bash
D=$1
export BENCH_TIMEOUT=300
bash scripts/gpu_session11.sh "$D" "bench"
export PYTHONPATH=$PWD PYG_DFGNN_CACHE=/tmp/dfgnn_new
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio
for c in "transformer 4x64 fp32" "agnn 4x64 fp32" "gat 4x64 fp32" "transformer 8x10 bf16" "gatv2 8x10 bf16"; do
  set -- $c
  timeout 120 ncu -k regex:'fwd_kernel|bwd_row|bwd_col' --launch-skip 6 --launch-count 3 --metrics $M \
    python scripts/ncu_layer.py --layer $1 --shape $2 --dtype $3 --graph uniform_100k > "$D/ncu_$1_$2_$3.txt" 2>&1
  echo "ncu $c rc=$?"
done
grep -h -E "fwd_kernel|bwd_row|bwd_col|duration|dram__|lts__t|warps_active" "$D"/ncu_*.txt | head -120
