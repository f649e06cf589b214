"""AGNN's prologue on small CUDA calls with autograd: the six ATen autograd
nodes (norm, clamp, reciprocal, two products) against the one
``ops._AGNNPrologue`` node with its two kernels (what
``ops._prologue_node`` picks since session 24).  AGNNConv at 1 x 80 (the
bench's "8x10") on the PATTERN-like batch of 128 graphs, fp32 and bf16, one
process, the two paths alternated for ``--rounds`` rounds of ``--calls``
synchronised forward+backward calls each; prints the medians of the rounds'
medians and their ratio, and the no-grad forward's wall time.  GPU only::

    PYTHONPATH=. python scripts/ab_prologue_node.py [--rounds 7] [--calls 50]

Session 24 (H200): node / ATen forward+backward wall 0.69-0.73
(docs/KERNELS.md).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_shapes as bs  # noqa: E402

from pyg_dfgnn import ops  # noqa: E402


def wall_ms(fn, calls: int) -> float:
    ts = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=50)
    a = ap.parse_args(argv)
    dev = torch.device("cuda")
    g = bs.load_graph(next(s for s in bs.GRAPHS if s["name"] == "pattern_128"))
    ei = g.edge_index.to(dev)
    node = ops._prologue_node
    paths = {"aten": lambda x, beta: False, "node": node}
    try:
        for dname in ("fp32", "bf16"):
            _, layer, x = bs.build("agnn", 8, 10, bs.DTYPES[dname], dev, g.num_nodes)
            xs = x.detach().requires_grad_(True)

            def fb():
                out = layer(xs, ei)
                out.backward(torch.ones_like(out))

            def fwd():
                with torch.no_grad():
                    layer(x, ei)

            res = {"aten": [], "node": [], "fwd": []}
            for _ in range(a.rounds):
                for name, pick in paths.items():
                    ops._prologue_node = pick
                    for _ in range(5):
                        fb()
                    torch.cuda.synchronize()
                    res[name].append(wall_ms(fb, a.calls))
                res["fwd"].append(wall_ms(fwd, a.calls))
            m = {k: statistics.median(v) for k, v in res.items()}
            print(f"agnn 1x80 {dname} pattern_128 ({torch.cuda.get_device_name()}): forward+"
                  f"backward wall aten {m['aten']:.3f} ms, node {m['node']:.3f} ms "
                  f"(node / aten {m['node'] / m['aten']:.3f}); no-grad forward {m['fwd']:.3f} ms")
    finally:
        ops._prologue_node = node


if __name__ == "__main__":
    main()
