"""The trainer's models (``compile: true``) trace without a graph break with the
fused layers, and the compiled forward and backward equal eager ones."""
import pytest
import torch
import torch._dynamo

from pyg_dfgnn.data import pattern_like_batch
from pyg_dfgnn.train.config import load_config
from pyg_dfgnn.train.models import build_model

CONFIGS = {"gat": "configs/pattern_gat.yaml", "gt": "configs/pattern_gt.yaml",
           "agnn": "configs/pattern_agnn.yaml"}


def _model(name, backend="fused"):
    over = ["model.layers=2"] + (["model.lap_pe=false"] if name == "gt" else [])
    cfg = load_config(CONFIGS[name], over)
    torch.manual_seed(0)
    return build_model(cfg.model, 3, 2, True, backend)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_trainer_models_have_no_graph_break(name):
    b = pattern_like_batch(2, seed=0)
    model = _model(name).train()
    torch._dynamo.reset()
    ex = torch._dynamo.explain(model)(b.x, b.edge_index)
    assert ex.graph_break_count == 0, [str(r.reason) for r in ex.break_reasons]
    assert ex.graph_count == 1


@pytest.mark.parametrize("name", list(CONFIGS))
def test_compiled_model_equals_eager(name):
    """float64, dynamic shapes, batches of different sizes: one compiled graph
    (fullgraph: no break; one frame: no recompilation) serves them all, and
    outputs and every parameter gradient equal eager's."""
    from torch._dynamo.testing import CompileCounterWithBackend
    model = _model(name).double().eval()   # eval: no dropout / BN batch statistics
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, dynamic=True, fullgraph=True, backend=counter)
    frames = []
    for n, s in ((2, 0), (3, 1), (4, 2)):
        b = pattern_like_batch(n, seed=s)
        grads = []
        for m in (model, compiled):
            out = m(b.x, b.edge_index)
            out.square().sum().backward()
            grads.append((out.detach(), [p.grad.clone() if p.grad is not None else None
                                         for p in model.parameters()]))
            model.zero_grad(set_to_none=True)
        frames.append(counter.frame_count)
        (o1, g1), (o2, g2) = grads
        torch.testing.assert_close(o2, o1, rtol=1e-12, atol=1e-12)
        for a, c in zip(g1, g2):
            assert (a is None) == (c is None)
            if a is not None:
                torch.testing.assert_close(c, a, rtol=1e-12, atol=1e-12)
    assert frames[0] >= 1 and frames[-1] == frames[0], frames   # no recompilation


@pytest.mark.parametrize("name", list(CONFIGS))
def test_training_mode_compiles_fullgraph_dynamic(name):
    """Training mode (dropout, BatchNorm statistics) with dynamic shapes:
    fullgraph compiles and no recompilation across batch sizes (a symbolic
    float once broke the graph in the op's argument checks)."""
    from torch._dynamo.testing import CompileCounter
    model = _model(name).train()
    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(model, dynamic=True, fullgraph=True, backend=counter)
    frames = []
    for n, s in ((2, 0), (3, 1), (1, 2)):
        b = pattern_like_batch(n, seed=s)
        compiled(b.x, b.edge_index).sum().backward()
        frames.append(counter.frame_count)
    assert frames[0] >= 1 and frames[-1] == frames[0], frames   # no recompilation
