"""Full-graph layer-wise inference (data.eval=layerwise) equals the model's
full-batch forward; the trainer evaluates with it; max_steps_per_epoch."""
import json

import pytest
import torch

from pyg_dfgnn.data.synthetic import powerlaw_graph
from pyg_dfgnn.train.cli import main
from pyg_dfgnn.train.config import ModelConfig
from pyg_dfgnn.train.models import build_model
from pyg_dfgnn.train.sampling import layerwise_inference, model_stages, to_csc

from .conftest import CONFIGS, fused_available
from .test_sampled import TINY_SAMPLED

BACKENDS = ["pyg"] + (["fused"] if fused_available() else [])
N = 60
MODELS = {
    "gat_mlp": dict(name="gat", readout="mlp", layers=3, hidden=16, heads=2),
    "gat_linear_nores": dict(name="gat", readout="linear", layers=2, hidden=16, heads=2,
                             residual=False),
    "gt": dict(name="gt", layers=2, hidden=16, heads=2),
    "agnn_block": dict(name="agnn", layers=2, hidden=16, batch_norm=True, residual=True,
                       readout="mlp"),
    "agnn_plain": dict(name="agnn", layers=3, hidden=16),
}


def _graph():
    ei = powerlaw_graph(N, 500, 40, seed=1)   # in-degrees up to 40, a few isolated targets
    return ei, to_csc(ei, N)


def _model(mc, backend, categorical, dtype):
    torch.manual_seed(0)
    m = build_model(ModelConfig(**mc), 5, 3, categorical, backend).to(dtype)
    for mod in m.modules():   # BatchNorm with non-trivial running statistics
        if isinstance(mod, torch.nn.BatchNorm1d):
            mod.running_mean.normal_()
            mod.running_var.uniform_(0.5, 2.0)
    return m.eval()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_layerwise_equals_full_forward_float64(backend, name):
    """float64 (integer inputs -> embedding, so the whole model is float64): the
    chunked inference adds the same terms per target in another order, so the
    difference is a few ulps: (max in-degree + 1) * eps64 per layer, far below 1e-12."""
    ei, (colptr, row) = _graph()
    m = _model(MODELS[name], backend, True, torch.float64)
    x = torch.randint(0, 5, (N,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = m(x, ei)
    assert full.dtype == torch.float64
    assert float(full.std(0).min()) > 1e-3   # the nodes' outputs differ: a real comparison
    for bs in (7, 16, N, 10 * N):   # chunks of 7 .. one chunk
        lw = layerwise_inference(m, x, colptr, row, bs)
        torch.testing.assert_close(lw, full, rtol=1e-12, atol=1e-12 * float(full.abs().max()))
    # a wrong graph is noticed: the comparison can fail
    bad = row.clone()
    bad[0] = (bad[0] + 1) % N
    assert not torch.allclose(layerwise_inference(m, x, colptr, bad, 7), full, rtol=1e-6,
                              atol=1e-9)


@pytest.mark.parametrize("backend", BACKENDS)
def test_layerwise_gat_conv_readout_float32(backend):
    """GATNet with readout=conv casts x to float32 itself, so the model runs in
    float32: per layer the softmax-weighted sum of <= max_deg + 1 terms in another
    order moves the result by <= (max_deg + 1) * eps32 relative; bound over 3 layers."""
    ei, (colptr, row) = _graph()
    m = _model(dict(name="gat", readout="conv", layers=3, hidden=8, heads=2, out_heads=2),
               backend, False, torch.float32)
    x = torch.randn(N, 5, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = m(x, ei)
    max_deg = int((colptr[1:] - colptr[:-1]).max())
    tol = 3 * (max_deg + 1) * torch.finfo(torch.float32).eps * float(full.abs().max())
    torch.testing.assert_close(layerwise_inference(m, x, colptr, row, 7), full, rtol=0,
                               atol=tol)


def test_layerwise_argument_checks():
    ei, (colptr, row) = _graph()
    m = _model(MODELS["gat_mlp"], "pyg", True, torch.float64)
    x = torch.randint(0, 5, (N,))
    with pytest.raises(ValueError, match="batch_size"):
        layerwise_inference(m, x, colptr, row, 0)
    with pytest.raises(ValueError, match="rows"):
        layerwise_inference(m, x[:-1], colptr, row, 8)
    m.train()
    with pytest.raises(ValueError, match="eval mode"):
        model_stages(m)
    with pytest.raises(TypeError, match="no layer decomposition"):
        model_stages(torch.nn.Linear(2, 2).eval())


def _results(out):
    return json.loads((out / "results.json").read_text())


def test_trainer_layerwise_equals_full_eval_and_step_cap(tmp_path):
    """The same sampled training evaluated layer-wise and with one full-graph
    forward gives the same metrics (float32: the losses to rounding); the epochs
    stop after max_steps_per_epoch steps and results.json says so."""
    base = [str(CONFIGS / "cora_gat_sampled_quick.yaml")] + TINY_SAMPLED + [
        "backend=pyg", "epochs=2", "max_steps_per_epoch=2", "checkpoint.enabled=false",
        f"data.root={tmp_path / 'data'}", "eval_test_every=1"]
    for ev in ("layerwise", "full", "sampled"):
        assert main(base + [f"data.eval={ev}", "data.eval_batch_size=37",
                            f"out_dir={tmp_path / ev}"]) == 0
    lw, full, sampled = (_results(tmp_path / ev) for ev in ("layerwise", "full", "sampled"))
    for a, b in zip(lw["history"], full["history"]):
        assert a["train_loss"] == b["train_loss"]          # the same training
        assert a["val_metric"] == b["val_metric"] and a["test_metric"] == b["test_metric"]
        assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-5)
    assert lw["config"]["data"]["eval"] == "layerwise"
    # 180 training seeds / batch 32 = 6 steps, capped at 2
    for r in (lw, sampled):
        assert [(h["steps"], h["steps_per_epoch"], h["capped"]) for h in r["history"]] == \
            [(2, 6, True)] * 2
        assert r["training"]["max_steps_per_epoch"] == 2 and r["training"]["capped"] is True
    assert sampled["history"][0]["train_loss"] == lw["history"][0]["train_loss"]
    log = (tmp_path / "layerwise" / "train.log").read_text()
    assert "eval = layer-wise full-graph inference (37 target nodes per chunk)" in log
    assert "2 of 6 steps (max_steps_per_epoch)" in log


def test_graph_batches_step_cap(tmp_path, tiny_args):
    out = tmp_path / "run"
    assert main(tiny_args("epochs=1", "max_steps_per_epoch=1", "checkpoint.enabled=false",
                          "backend=pyg")) == 0
    h = _results(out)["history"][0]
    assert (h["steps"], h["steps_per_epoch"], h["capped"]) == (1, 2, True)   # 16 graphs / 8
