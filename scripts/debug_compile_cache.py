"""Debug: graph-cache hits of the compiled (Inductor) fused model on CUDA."""
import sys, traceback
from pathlib import Path
import torch
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pyg_dfgnn import graph as G
from pyg_dfgnn.data import GraphBatcher, PrepareGraphs, generate_split
from pyg_dfgnn.train.config import load_config
from pyg_dfgnn.train.models import build_model

dev = torch.device("cuda")
cfg = load_config("configs/pattern_gt.yaml", ["model.lap_pe=false", "model.layers=2"])
torch.manual_seed(0)
net = build_model(cfg.model, 3, 2, True, "fused").to(dev)
prep = PrepareGraphs.for_model(net)
store = GraphBatcher(generate_split("PATTERN", "train", 40, seed=0), prep.views, build_device=dev)
seen = {}
orig_get = G._cache.get
def get(adj, key, build, trusted=False):
    h = G._cache.hits
    r = orig_get(adj, key, build, trusted)
    if G._cache.hits == h:
        print("MISS id", id(adj), "known", id(adj) in seen, "ptr", adj.data_ptr(), "ptr known",
              adj.data_ptr() in {v for v in seen.values()}, "ver", adj._version, "type", type(adj),
              "key", key, flush=True)
        traceback.print_stack(limit=8)
    return r
G._cache.get = get
cn = torch.compile(net, dynamic=True)
for i in range(4):
    b = store.batch(list(range(i * 5, i * 5 + 5)), dev)
    seen[id(b.edge_index)] = b.edge_index.data_ptr()
    h0, m0 = G._cache.hits, G._cache.misses
    out = cn(b.x, b.edge_index)
    out.square().sum().backward()
    torch.cuda.synchronize()
    print("step", i, "hits", G._cache.hits - h0, "misses", G._cache.misses - m0,
          "edge_index id", id(b.edge_index), "ptr", b.edge_index.data_ptr(), flush=True)
