"""Accuracy of GATConv forward+backward on a large uniform graph (500k nodes,
8M edges, 4 x 64): ours (fp32) and PyG's (fp32) against a float64 run of
PyG's layer with the same weights and inputs.  GPU only (about 20 GB):

    PYTHONPATH=. python scripts/check_large_gat.py [--nodes 500000 --edges 8000000]
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch_geometric.nn as pygnn  # noqa: E402

import pyg_dfgnn.nn as dnn  # noqa: E402
from pyg_dfgnn.data import synthetic  # noqa: E402


def run(layer, x, ei, g):
    x = x.detach().requires_grad_(True)
    out = layer(x, ei)
    out.backward(g.to(out.dtype))
    grads = {"x": x.grad}
    grads.update({n: p.grad for n, p in layer.named_parameters()})
    return out.detach(), grads


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=500000)
    ap.add_argument("--edges", type=int, default=8000000)
    ap.add_argument("--layer", default="GATConv")
    a = ap.parse_args()
    dev = torch.device("cuda")
    ei = synthetic.uniform_graph(a.nodes, a.edges, 1).to(dev)
    torch.manual_seed(0)
    ref = getattr(pygnn, a.layer)(64, 64, heads=4).to(dev)
    ours = getattr(dnn, a.layer)(64, 64, heads=4).to(dev)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(a.nodes, 64, device=dev)
    g = torch.randn(a.nodes, 256, device=dev)
    o64, g64 = run(ref.double(), x.double(), ei, g.double())
    ref.float()
    for name, layer in (("pyg fp32", ref), ("ours fp32", ours)):
        for p in layer.parameters():
            p.grad = None
        o, gr = run(layer, x, ei, g)
        errs = {"out": ((o.double() - o64).abs().max() / o64.abs().max()).item()}
        for k, v in gr.items():
            errs[k] = ((v.double() - g64[k]).abs().max() / g64[k].abs().max()).item()
        print(f"{torch.cuda.get_device_name()} {a.layer} {a.nodes}/{a.edges} {name}: " +
              ", ".join(f"{k} {v:.2e}" for k, v in errs.items()), flush=True)


if __name__ == "__main__":
    main()
