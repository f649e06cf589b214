"""The layers leave no tensors in reference cycles.

A tensor that only a reference cycle keeps alive (e.g. a context object that
holds its own output) is freed at the garbage collector's next run instead of
when the step ends: a training loop holds it for an unknown time, and a
collection that happens to run inside a measured interval moves the
measured peak by its size.  After one warm-up call, the layers' forward and
backward in training mode (dropout on, attention weights returned where the
layer offers them) must leave nothing tensor-valued to the collector.
"""
import gc

import pytest
import torch

from pyg_dfgnn.nn import AGNNConv, GATConv, GATv2Conv, TransformerConv

from ._equiv import DEVICES

F_IN = 16
CASES = [
    pytest.param(lambda: GATConv(F_IN, 8, heads=4, dropout=0.1), False, id="gat"),
    pytest.param(lambda: GATConv(F_IN, 8, heads=4), True, id="gat-alpha"),
    pytest.param(lambda: GATv2Conv(F_IN, 8, heads=4, dropout=0.1), False, id="gatv2"),
    pytest.param(lambda: GATv2Conv(F_IN, 8, heads=4), True, id="gatv2-alpha"),
    pytest.param(lambda: TransformerConv(F_IN, 8, heads=4, dropout=0.1), False,
                 id="transformer"),
    pytest.param(lambda: TransformerConv(F_IN, 8, heads=4), True, id="transformer-alpha"),
    pytest.param(lambda: AGNNConv(requires_grad=True), False, id="agnn"),
]


def _cyclic_tensors(step) -> list:
    """Shapes of the tensors that only reference cycles keep alive after
    ``step()`` (the collector off while it runs, so that nothing is collected
    before the check)."""
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        step()
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        found = [tuple(o.shape) for o in gc.garbage if isinstance(o, torch.Tensor)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if enabled:
            gc.enable()
    return found


@pytest.mark.parametrize("graphs", [1, 8], ids=["small", "batch"])
@pytest.mark.parametrize("make,alpha", CASES)
@pytest.mark.parametrize("device", DEVICES)
def test_no_tensors_in_reference_cycles(make, alpha, graphs, device):
    from pyg_dfgnn.data import pattern_like_batch
    torch.manual_seed(0)
    ei = pattern_like_batch(graphs, seed=0).edge_index.to(device)
    n = int(ei.max()) + 1
    conv = make().to(device).train()
    x = torch.randn(n, F_IN, device=device, requires_grad=True)

    def step():
        for _ in range(2):
            res = conv(x, ei, return_attention_weights=True) if alpha else conv(x, ei)
            out = res[0] if alpha else res
            loss = out.square().mean()
            if alpha:
                loss = loss + res[1][1].square().mean()   # (alpha's gradient too)
            loss.backward()
            conv.zero_grad(set_to_none=True)
            x.grad = None
        if device == "cuda":
            torch.cuda.synchronize()

    step()   # warm-up: builds, caches and one-time state outside the check
    assert _cyclic_tensors(step) == []
