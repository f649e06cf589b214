"""Op-level A/B of the feature width the CUDA kernels run at, for a head width
that needs no copy with the 8-byte vector (8 x 10 fp32) against the same
problem zero-padded by the caller to the 16-byte vector (8 x 12): decides
whether GPU-bound layers should still project to the padded width
(pyg_dfgnn.nn._padded).  Forward and forward+backward, CUDA events, the
variants interleaved round-robin on the same inputs, medians.  GPU only:

    PYTHONPATH=. python scripts/width_ab.py [--reps 15]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_shapes import GRAPHS  # noqa: E402
from tune_schedule import timed_interleaved  # noqa: E402

from pyg_dfgnn import ops  # noqa: E402
from pyg_dfgnn.bench.graphs import load_graph  # noqa: E402
from pyg_dfgnn.graph import get_graph  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--feat", type=int, default=10)
    ap.add_argument("--pad", type=int, default=12)
    a = ap.parse_args(argv)
    dev = torch.device("cuda")
    H, C, P = a.heads, a.feat, a.pad
    print(f"{torch.cuda.get_device_name()}: {H} x {C} run as is vs padded to {H} x {P}, fp32")
    for spec in GRAPHS:
        bg = load_graph(spec)
        ei, n = bg.edge_index.to(dev), bg.num_nodes
        g = get_graph(ei, (n, n))
        gen = torch.Generator(device=dev).manual_seed(0)
        base = {k: torch.randn(n, H, C, device=dev, generator=gen) for k in "qkv"}
        asrc = torch.randn(n, H, device=dev, generator=gen)
        adst = torch.randn(n, H, device=dev, generator=gen)
        fns = {}
        for width in (C, P):
            t = {k: (F.pad(v, (0, width - C)) if width != C else v).requires_grad_(True)
                 for k, v in base.items()}
            for kind in ("dot", "gat"):
                def run(t=t, kind=kind, bwd=False):
                    if kind == "dot":
                        out, _ = ops.dot_attention(g, t["q"], t["k"], t["v"], scale=0.3)
                    else:
                        out, _ = ops.gat_attention(g, t["v"], asrc, adst)
                    if bwd:
                        out.backward(torch.ones_like(out))
                fns[kind, width, "fwd"] = run
                fns[kind, width, "fb"] = lambda run=run: run(bwd=True)
        med = timed_interleaved(fns, warmup=3, reps=a.reps)
        for kind in ("dot", "gat"):
            r = {k: med[kind, w, k2] for w in (C, P) for k2 in ("fwd", "fb")
                 for k in [(w, k2)]}
            print(f"  {spec['name']:14s} {kind}: fwd {r[C, 'fwd']:.3f} vs {r[P, 'fwd']:.3f} ms, "
                  f"f+b {r[C, 'fb']:.3f} vs {r[P, 'fb']:.3f} ms  (width {C} vs {P})",
                  flush=True)


if __name__ == "__main__":
    main()
