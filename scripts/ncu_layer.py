"""One fused layer forward+backward after warm-up calls, for Nsight Compute:

    ncu -k regex:'fwd_kernel|bwd_row|bwd_col' --launch-skip 6 --launch-count 3 \
        --section SpeedOfLight --section WarpStateStats --section Occupancy \
        python scripts/ncu_layer.py --layer transformer --shape 8x10 --dtype bf16

(2 warm-up calls launch each of the three kernels twice: skip 6.)  GPU only.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_shapes as bs  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--layer", default="transformer")
    ap.add_argument("--shape", default="8x10")
    ap.add_argument("--graph", default="uniform_100k")
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--calls", type=int, default=3)
    a = ap.parse_args(argv)
    dev = torch.device("cuda")
    spec = next(g for g in bs.GRAPHS if g["name"] == a.graph)
    g = bs.load_graph(spec)
    ei = g.edge_index.to(dev)
    heads, feat = (int(v) for v in a.shape.split("x"))
    _, ours, x = bs.build(a.layer, heads, feat, bs.DTYPES[a.dtype], dev, g.num_nodes)
    xs = x.detach().requires_grad_(True)
    for _ in range(a.calls):
        out = ours(xs, ei)
        out.backward(torch.ones_like(out))
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
