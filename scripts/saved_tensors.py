"""What autograd keeps for backward in one training forward of a
``pyg_dfgnn.train.models`` model (CPU, fused layers): the census behind the
masked-BatchNorm change of session 10 (docs/KERNELS.md).

    PYTHONPATH=. python scripts/saved_tensors.py gt --graphs 26 [--mask] [--bf16] [--layer 3]

Counts every saved storage once.  ``--mask`` passes ``node_mask`` (the padded
CUDA-graph steps: masked BatchNorm); ``--bf16`` runs under CPU autocast;
``--layer K`` lists the tensors one block (GT layer / GAT block K) saves.
"""
import argparse
from types import SimpleNamespace as NS

import torch

from pyg_dfgnn.data.sbm import pattern_like_batch
from pyg_dfgnn.train.models import build_model

COMMON = dict(readout="mlp", batch_norm=True, residual=True, dropout=0.0, in_dropout=0.0,
              attn_dropout=0.0)
MODELS = {   # the shipped PATTERN paper configs
    "gt": NS(name="gt", layers=10, hidden=80, out_dim=80, heads=8, layer_norm=False,
             lap_pe=True, lap_pe_dim=2, **COMMON),
    "gat": NS(name="gat", layers=4, hidden=152, out_dim=152, heads=8, self_loops=True,
              out_heads=1, **COMMON),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=sorted(MODELS))
    ap.add_argument("--graphs", type=int, default=26)
    ap.add_argument("--mask", action="store_true")
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--layer", type=int, default=None)
    a = ap.parse_args()
    m = MODELS[a.model]
    torch.manual_seed(0)
    model = build_model(m, 3, 2, True, "fused")
    batch = pattern_like_batch(a.graphs, seed=0)
    N = int(batch.num_nodes)
    x = torch.randint(0, 3, (N,))
    mask = torch.ones(N, dtype=torch.bool) if a.mask else None
    kw = {"lap_pe": torch.randn(N, 2)} if m.name == "gt" else {}
    seen = {}
    listing = []

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in seen:
            seen[s.data_ptr()] = s.nbytes()
            listing.append((tuple(t.shape), str(t.dtype).replace("torch.", ""), s.nbytes()))
        return t
    amp = torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), amp:
        if a.layer is None:
            model(x, batch.edge_index, node_mask=mask, **kw)
        else:
            h = torch.randn(N, m.hidden, requires_grad=True)
            if m.name == "gt":
                model.layers[a.layer](h, batch.edge_index, mask)
            else:
                model.block(a.layer, h, batch.edge_index, mask)
    total = sum(seen.values())
    unit = N * m.hidden * 4
    print(f"{a.model} {N} nodes / {batch.edge_index.size(1)} edges, mask={a.mask}, "
          f"bf16={a.bf16}: saved {total / 2**20:.1f} MiB = {total / unit:.1f} x [N, {m.hidden}] fp32")
    if a.layer is not None:
        for shape, dtype, nbytes in listing:
            print(f"  {str(shape):18s} {dtype:9s} {nbytes / unit:5.2f}")


if __name__ == "__main__":
    main()
