"""Small forward+backward of every kernel path, for compute-sanitizer:

    compute-sanitizer --tool memcheck python scripts/sanitizer_smoke.py
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "ops"))
from _cases import KINDS, call, leaves, make_inputs, random_graph  # noqa: E402

from pyg_dfgnn import schedule  # noqa: E402
from pyg_dfgnn.graph import get_graph  # noqa: E402

torch.manual_seed(0)
for name, kind in KINDS.items():
    for dtype in (torch.float32, torch.bfloat16):
        for feat in (3, 10, 19, 64, 300):
            ei = random_graph(60, 50, 300, super_node=(400, 2))
            ei = torch.cat([ei, torch.stack([torch.full((300,), 4), torch.randint(0, 50, (300,))])], 1)
            g = get_graph(ei.cuda(), (60, 50))
            inp = make_inputs(kind, 60, 50, ei.size(1), 2, feat, dtype, "cuda", True)
            for v in leaves(inp):
                v.requires_grad_(True)
            for split, group in ((None, None), (64, None), (None, 1), (64, 2)):
                with schedule.override(split=split, group=group):
                    out, alpha = call(kind, g, inp, dropout=0.3, return_alpha=True)
                    torch.autograd.grad(out, leaves(inp), torch.randn_like(out))
torch.cuda.synchronize()
print("sanitizer smoke: all kernel paths ran")
