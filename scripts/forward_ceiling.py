"""How far a layer's forward speed-up over PyG can go at most, per bench cell.

The fused layer's forward is the attention kernel plus work PyG's layer does
too: the projection GEMMs (same shapes, same dtype, same cuBLAS) and a few
element-wise ops.  With the attention kernel taking no time at all, the
forward speed-up would be ``PyG's forward / that shared work``: a cell whose
ceiling is below issue 11's target cannot reach it by kernel work.

Reads a ``scripts/kernel_ab.py`` JSON-lines file (its layers take the bench's
64 input features, configs/bench_default.yaml; GPU time of the no-grad
forward, ``gpu_fwd_ms``, and of each attention kernel class, torch.profiler)
and a ``dfgnn bench`` ``results.json`` (PyG's forward wall time per cell,
CUDA events, medians), both from one GPU::

    python scripts/forward_ceiling.py KERNEL_AB.jsonl BENCH_DIR/results.json

Columns: PyG's forward, ours (wall), ours (GPU), our attention kernels, the
rest of our forward's GPU time, the speed-up now, and the ceilings with the
attention kernels at zero and at the time their gathered rows take to read
once from DRAM (``--bw`` GB/s; the gathered source rows per edge, keys and
values for dot attention, at their dtype's width).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kernel_ab")
    ap.add_argument("bench_results")
    ap.add_argument("--bw", type=float, default=4800.0,
                    help="DRAM bandwidth for the gather floor, GB/s (H200: 4800)")
    a = ap.parse_args(argv)
    bench = json.loads(Path(a.bench_results).read_text())["results"]
    cells = {(r["graph"], r["case"], r["shape"], r["dtype"], r["contender"]): r
             for r in bench if r.get("section") == "layer"}
    print(f"{'graph':14s} {'layer':11s} {'shape':5s} {'dtype':8s} {'pyg':>7s} {'wall':>7s} "
          f"{'gpu':>7s} {'attn':>7s} {'rest':>7s} {'now':>6s} {'max':>6s} {'floor':>6s} target")
    for line in Path(a.kernel_ab).read_text().splitlines():
        k = json.loads(line)
        dt = _DTYPES.get(k["dtype"], k["dtype"])
        pyg = cells.get((k["graph"], k["layer"], k["shape"], dt, "pyg"))
        ours = cells.get((k["graph"], k["layer"], k["shape"], dt, "fused"))
        if pyg is None or ours is None or pyg.get("fwd_ms") is None:
            continue
        attn = sum(v for c, v in k["kernels"].items() if c in ("fwd_kernel", "fwd_merge"))
        rest = max(k["gpu_fwd_ms"] - attn, 1e-6)
        heads, feat = (int(v) for v in k["shape"].split("x"))
        rows = 2 if k["layer"] == "transformer" else 1   # (AGNN: keys are the values)
        gather_ms = (ours["num_edges_eff"] * heads * feat * _BYTES[dt] * rows) / (a.bw * 1e6)
        target = 12.0 if k["shape"] == "4x64" else 10.0
        print(f"{k['graph']:14s} {k['layer']:11s} {k['shape']:5s} {dt:8s} {pyg['fwd_ms']:7.3f} "
              f"{ours['fwd_ms']:7.3f} {k['gpu_fwd_ms']:7.3f} {attn:7.3f} {rest:7.3f} "
              f"{pyg['fwd_ms'] / ours['fwd_ms']:6.1f} {pyg['fwd_ms'] / rest:6.1f} "
              f"{pyg['fwd_ms'] / (rest + gather_ms):6.1f} {target:.0f}x")


if __name__ == "__main__":
    main()
