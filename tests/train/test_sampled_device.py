"""Sampling on the device (``data.sample_on``): :class:`DeviceNeighborSampler`
against the NeighborLoader path, its invariants and distribution, the config
key, and the trainer's sampled epochs with batches made on the device.

The device sampler is device-agnostic: the CPU tests run it on CPU tensors
(``device="cpu"``); the tests marked ``cuda`` run the same checks on a GPU."""
import itertools
import json
import math

import pytest
import torch
from torch_geometric.data import Data

from pyg_dfgnn.data.synthetic import powerlaw_graph
from pyg_dfgnn.train.config import ConfigError, describe_schema, load_config
from pyg_dfgnn.train.sampling import (DeviceNeighborSampler, SampledNodeTraining,
                                      TorchNeighborSampler, make_loader,
                                      sample_neighbors_device)

from .conftest import CONFIGS
from .test_sampled import TINY_SAMPLED

HAS_CUDA = torch.cuda.is_available()
needs_cuda = [pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")]

N = 400


def _data(n=N, e=6000, max_deg=300, seed=1):
    """A power-law graph (in-degrees 0 .. ``max_deg``, so every regime of the
    chooser occurs) with features, labels and masks."""
    ei = powerlaw_graph(n, e, max_deg, seed=seed)
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(n, generator=g) < 0.5
    return Data(x=torch.randn(n, 6, generator=g), edge_index=ei,
                y=torch.randint(0, 4, (n,), generator=g), train_mask=mask, val_mask=~mask)


def _seeds(n=N, count=50, seed=0):
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:count]


def _cpu_batches(data, fanout, seeds, bs):
    """The NeighborLoader path where neither pyg-lib nor torch-sparse is installed
    (the GPU machine): :class:`TorchNeighborSampler`'s vectorised sampler."""
    return list(make_loader(data, TorchNeighborSampler(data, fanout, native=False), seeds, bs))


def _device_sampler(data, fanout, device):
    """On ``device``, with the CPU sampler's CSC (as the trainer builds it)."""
    s = TorchNeighborSampler(data, fanout)
    return DeviceNeighborSampler(data, fanout, device, csc=(s.colptr, s.row, s.perm))


def _check_batch(data, b, seeds, fanout):
    """Every invariant of a sampled batch against the graph ``data`` (CPU)."""
    b = b.clone().cpu()   # (Data.cpu() moves the batch itself)
    n = data.num_nodes
    ei = data.edge_index
    B = seeds.numel()
    node, (r, c) = b.n_id, b.edge_index
    assert b.batch_size == B and torch.equal(node[:B], seeds)        # seeds first, in order
    assert torch.unique(node).numel() == node.numel()                # every node once
    assert bool((c[1:] >= c[:-1]).all())                             # destination-major
    g = torch.stack([node[r], node[c]])
    assert torch.equal(ei[:, b.e_id], g)                              # e_id: the graph's edges
    assert torch.unique(g[0] * n + g[1]).numel() == g.size(1)         # distinct edges
    for key in ("x", "y", "train_mask", "val_mask"):                  # attributes follow n_id
        assert torch.equal(b[key], data[key][node]), key
    # hop h: each target (a node new in hop h - 1) has min(k, deg) sampled in-edges
    deg = torch.bincount(ei[1], minlength=n)
    cnt = torch.bincount(c, minlength=node.numel())
    lo, hi = 0, B
    for h, k in enumerate(fanout):
        t = torch.arange(lo, hi)
        want = deg[node[t]] if k < 0 else deg[node[t]].clamp(max=k)
        assert torch.equal(cnt[t], want), f"hop {h}"
        if h + 1 < len(fanout):   # the next hop's targets: the nodes this hop found
            new = torch.unique(r[(c >= lo) & (c < hi)])
            new = new[new >= hi]
            assert torch.equal(new, torch.arange(hi, hi + new.numel()))
            lo, hi = hi, hi + new.numel()
    assert hi == node.numel() or len(fanout) == 0 or cnt[hi:].sum() == 0


# ---------------------------------------------------------------------------- CPU tensors
@pytest.mark.parametrize("fanout", [[-1, -1], [300, 400], [-1, 1000]],
                         ids=["all", "k_ge_maxdeg", "mixed"])
def test_equals_neighbor_loader_when_every_in_edge_is_taken(fanout):
    """With fan-out -1 or k >= every degree nothing is random: the batches equal
    the NeighborLoader path's exactly (same keys, node order, edge order)."""
    data = _data()
    seeds = _seeds(count=45)
    ref = _cpu_batches(data, fanout, seeds, 20)
    ds = _device_sampler(data, fanout, "cpu")
    got = list(ds.loader(seeds, 20))
    assert len(got) == len(ref) == 3
    for a, b in zip(ref, got):
        assert set(a.keys()) == set(b.keys())
        for key in a.keys():
            va, vb = a[key], b[key]
            if isinstance(va, torch.Tensor):
                assert va.dtype == vb.dtype and torch.equal(va, vb), key
            else:
                assert va == vb, key
    _check_batch(data, got[0], seeds[:20], fanout)


@pytest.mark.parametrize("k", [3, 8, 40])   # rows with deg <= k, k < deg <= 4k, deg > 4k
def test_invariants_and_layout(k):
    data = _data()
    seeds = _seeds(count=50)
    ds = _device_sampler(data, [k, 2, 3], "cpu")
    b = ds.batch(seeds, ds.generator(0))
    _check_batch(data, b, seeds, [k, 2, 3])
    ref = _cpu_batches(data, [k, 2, 3], seeds, 50)[0]
    assert set(ref.keys()) == set(b.keys())
    for key in ref.keys():
        if isinstance(ref[key], torch.Tensor):
            assert ref[key].dtype == b[key].dtype and ref[key].dim() == b[key].dim(), key


def test_reproducible_with_the_same_seed():
    data = _data()
    seeds = _seeds(count=60)
    ds = _device_sampler(data, [10, 5], "cpu")

    def run(seed):
        return [b.edge_index for b in ds.loader(seeds, 25, ds.generator(seed))]
    a, b, c = run(7), run(7), run(8)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(a, c))


@pytest.mark.parametrize("d,k", [(10, 5), (60, 5), (6, 1)])
def test_uniform_marginals(d, k):
    """T targets with d in-edges each: every in-edge is chosen with probability k/d
    (Floyd's algorithm; 5 sigma of the binomial frequency)."""
    T = 3000
    colptr = torch.cat([torch.arange(T + 1) * d, torch.full((997,), T * d)])
    row = torch.arange(T * d) % 997 + T
    out = sample_neighbors_device(colptr, row, torch.arange(T), [k],
                                  generator=torch.Generator().manual_seed(0))
    assert torch.equal(torch.bincount(out.col, minlength=T), torch.full((T,), k))
    off = out.edge - colptr[out.node[out.col]]
    freq = torch.bincount(off, minlength=d).double() / T
    p = k / d
    assert (freq - p).abs().max() < 5 * math.sqrt(p * (1 - p) / T), (freq, p)


def test_uniform_subsets():
    """d=5, k=2: each of the 10 pairs of in-edges is equally likely (the joint
    distribution, not only the marginals)."""
    T, d, k = 20000, 5, 2
    colptr = torch.cat([torch.arange(T + 1) * d, torch.full((50,), T * d)])
    row = torch.arange(T * d) % 50 + T
    out = sample_neighbors_device(colptr, row, torch.arange(T), [k],
                                  generator=torch.Generator().manual_seed(1))
    off = (out.edge - colptr[out.node[out.col]]).view(T, k).sort(1).values
    assert bool((off[:, 0] < off[:, 1]).all())                      # distinct
    code = off[:, 0] * d + off[:, 1]
    pairs = [a * d + b for a, b in itertools.combinations(range(d), 2)]
    freq = torch.bincount(code, minlength=d * d)[pairs].double() / T
    p = 1 / len(pairs)
    assert (freq - p).abs().max() < 5 * math.sqrt(p * (1 - p) / T), freq


def test_edge_cases_and_errors():
    # edges 1->0, 2->0, 3->0, 0->1 in CSC form: nodes 2, 3 have no in-edges
    colptr = torch.tensor([0, 3, 4, 4, 4])
    row = torch.tensor([1, 2, 3, 0])
    out = sample_neighbors_device(colptr, row, torch.tensor([2, 3]), [2, 2])
    assert out.node.tolist() == [2, 3] and out.row.numel() == 0
    assert out.num_sampled_nodes == [2, 0, 0] and out.num_sampled_edges == [0, 0]
    out = sample_neighbors_device(colptr, row, torch.tensor([1]), [-1, 1, 5])
    # hop 1: 1 <- 0 (all); hop 2: one of 0's 3 in-edges; hop 3: 2 and 3 have none
    assert out.node[:2].tolist() == [1, 0] and out.num_sampled_edges == [1, 1, 0]
    g = torch.stack([out.node[out.row], out.node[out.col]])
    assert g[:, 0].tolist() == [0, 1] and g[1, 1] == 0 and int(g[0, 1]) in (1, 2, 3)
    assert out.node.numel() == 2 + (int(g[0, 1]) != 1)
    with pytest.raises(ValueError, match="duplicate"):
        sample_neighbors_device(colptr, row, torch.tensor([0, 0]), [2])
    with pytest.raises(ValueError, match="outside"):
        sample_neighbors_device(colptr, row, torch.tensor([4]), [2])
    with pytest.raises(ValueError, match="assoc"):
        sample_neighbors_device(colptr, row, torch.tensor([0]), [2],
                                assoc=torch.full((4,), -1))
    with pytest.raises(ValueError, match="batch_size"):
        DeviceNeighborSampler(_data(), [2], "cpu").loader(torch.arange(3), 0)


def test_buffer_is_left_clean_and_graph_bytes():
    data = _data()
    ds = _device_sampler(data, [5, 5], "cpu")
    for s in range(3):
        ds.batch(_seeds(count=30, seed=s), ds.generator(s))
        assert bool((ds.assoc == -1).all())
    n, e = data.num_nodes, data.num_edges
    attrs = n * 6 * 4 + n * 8 + 2 * n        # x float32, y int64, two bool masks
    assert DeviceNeighborSampler.graph_bytes(data) == 8 * (2 * (n + 2) + 2 * e) + attrs


# ---------------------------------------------------------------------------- config
def test_config_key_schema_and_errors():
    assert load_config(None, TINY_SAMPLED).data.sample_on == "auto"
    assert load_config(None, TINY_SAMPLED + ["data.sample_on=cpu"]).data.sample_on == "cpu"
    assert any(line.strip().startswith("data.sample_on: str = 'auto'  [auto | cpu | cuda]")
               for line in describe_schema())
    with pytest.raises(ConfigError, match="data.sample_on: 'gpu' is not allowed"):
        load_config(None, TINY_SAMPLED + ["data.sample_on=gpu"])
    with pytest.raises(ConfigError, match="data.sample_on=cpu needs data.loader=neighbor"):
        load_config(None, TINY_SAMPLED + ["data.loader=full", "data.sample_on=cpu"])
    cfg = load_config(str(CONFIGS / "powerlaw_gat_sampled.yaml"))
    assert cfg.data.sample_on == "auto"


@pytest.mark.skipif(HAS_CUDA, reason="this machine has CUDA")
@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_sample_on_gpu_without_a_gpu_run_exits_2(tmp_path, capsys, device):
    # (no test id "cuda": tests/conftest.py would skip it as a CUDA-only test)
    from pyg_dfgnn.train.cli import main
    rc = main([str(CONFIGS / "cora_gat_sampled_quick.yaml")] + TINY_SAMPLED + [
        "data.sample_on=cuda", f"device={device}", f"data.root={tmp_path / 'data'}",
        f"out_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and "data.sample_on" in err[0] and "CUDA" in err[0], err
    assert not (tmp_path / "run").exists()


def test_tiny_run_on_the_cpu_path(tmp_path):
    from pyg_dfgnn.train.cli import main
    out = tmp_path / "run"
    assert main([str(CONFIGS / "cora_gat_sampled_quick.yaml")] + TINY_SAMPLED + [
        "data.sample_on=cpu", "backend=pyg", "epochs=1", f"data.root={tmp_path / 'data'}",
        f"out_dir={out}"]) == 0
    log = (out / "train.log").read_text()
    assert "sampling: on the CPU (data.sample_on=cpu: as configured)" in log
    assert "sampling: NeighborLoader, num_neighbors=[4, 3]" in log
    r = json.loads((out / "results.json").read_text())
    assert r["status"] == "completed" and r["config"]["data"]["sample_on"] == "cpu"


# ---------------------------------------------------------------------------- trainer
def _force_device_sampling(monkeypatch):
    """The trainer's device path on a CPU run (the device sampler is device-agnostic)."""
    monkeypatch.setattr(SampledNodeTraining, "_sample_on_device",
                        lambda self: (True, "forced by the test"))


def _train(tmp_path, name, *extra):
    from pyg_dfgnn.train.trainer import train
    return train(load_config(None, TINY_SAMPLED + [
        "backend=pyg", f"data.root={tmp_path / 'data'}", f"out_dir={tmp_path / name}",
        "checkpoint.enabled=true"] + list(extra)))


def test_trainer_device_batches_equal_neighbor_loader_ones(tmp_path, monkeypatch):
    """All neighbours (no randomness in the subgraphs): a run whose batches are
    made by the device sampler trains and evaluates exactly like the
    NeighborLoader run (same seeds per step, same subgraphs, same losses)."""
    from pyg_dfgnn.train import sampling
    monkeypatch.setattr(sampling, "_native_sampling", lambda: False)  # as without pyg-lib
    over = ["data.num_neighbors=[-1, -1]", "epochs=2"]
    ref = _train(tmp_path, "cpu", *over, "data.sample_on=cpu")
    _force_device_sampling(monkeypatch)
    got = _train(tmp_path, "dev", *over)
    assert "sampling: on the device (cpu), num_neighbors=[-1, -1]" in (
        tmp_path / "dev" / "train.log").read_text()
    for a, b in zip(ref["history"], got["history"]):
        for key in ("train_loss", "train_metric", "val_loss", "val_metric"):
            assert a[key] == b[key], key
    assert ref["metrics"]["test_metric"] == got["metrics"]["test_metric"]


def test_trainer_device_sampling_resumes_exactly(tmp_path, monkeypatch):
    _force_device_sampling(monkeypatch)
    r2 = _train(tmp_path, "a", "epochs=2", "data.eval=layerwise")
    _train(tmp_path, "b", "epochs=1", "data.eval=layerwise")
    r = _train(tmp_path, "b", "epochs=2", "data.eval=layerwise", "resume=true")
    a = torch.load(tmp_path / "a" / "checkpoint_last.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "b" / "checkpoint_last.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert r["history"][-1]["train_loss"] == r2["history"][-1]["train_loss"]
    assert r["history"][-1]["val_loss"] == r2["history"][-1]["val_loss"]


# ---------------------------------------------------------------------------- CUDA
@pytest.mark.parametrize("fanout", [[15, 10, 5], [3, 40], [-1, 2]])
@pytest.mark.parametrize("_", [pytest.param(0, id="gpu", marks=needs_cuda)])
def test_sampling_on_the_gpu(fanout, _):
    data = _data(n=2000, e=40000, max_deg=1500)
    seeds = _seeds(n=2000, count=128)
    ds = _device_sampler(data, fanout, "cuda")
    assert ds.row.is_cuda and ds.node_attrs["x"].is_cuda
    b = ds.batch(seeds, ds.generator(3))
    assert all(v.is_cuda for v in b.to_dict().values() if isinstance(v, torch.Tensor))
    _check_batch(data, b, seeds, fanout)
    b2 = ds.batch(seeds, ds.generator(3))
    assert torch.equal(b.edge_index, b2.edge_index) and torch.equal(b.n_id, b2.n_id)
    assert bool((ds.assoc == -1).all())
    # every in-edge taken: equal to the NeighborLoader batch on the CPU
    full = [-1] * len(fanout)
    ds = _device_sampler(data, full, "cuda")
    ref = _cpu_batches(data, full, seeds[:16], 16)[0]
    got = ds.batch(seeds[:16]).cpu()
    assert set(ref.keys()) == set(got.keys())
    for key in ref.keys():
        if isinstance(ref[key], torch.Tensor):
            assert torch.equal(ref[key], got[key]), key


@pytest.mark.parametrize("_", [pytest.param(0, id="gpu", marks=needs_cuda)])
def test_one_host_sync_per_gpu_batch(_):
    """A batch (fan-outs below the largest degree) syncs with the host once: the
    per-hop counts, read together (torch's sync debug mode sees every
    synchronising copy / stream sync)."""
    import warnings
    data = _data(n=2000, e=40000, max_deg=1500)
    ds = _device_sampler(data, [15, 10, 5], "cuda")
    assert ds.max_degree > 15
    seeds = _seeds(n=2000, count=256).cuda()
    g = ds.generator(0)
    ds.batch(seeds[:128], g)
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            b = ds.batch(seeds[128:], g, torch.arange(128, 256, device="cuda"))
        finally:
            torch.cuda.set_sync_debug_mode(0)
    syncs = [x for x in w if "synchronizing CUDA operation" in str(x.message)]
    assert len(syncs) == 1, [str(x.message) for x in w]
    assert b.edge_index.size(1) > 0


@pytest.mark.parametrize("_", [pytest.param(0, id="gpu", marks=needs_cuda)])
def test_fused_and_pyg_agree_on_a_gpu_sampled_batch(_):
    """The same weights (build_model seeds both backends alike) on one batch
    sampled on the GPU, float64: the fused model (exact reference ops in
    float64) and PyG's layers sum the same terms per target in another order:
    a few ulps times (max in-degree + 1) per layer, far below 1e-10."""
    from pyg_dfgnn.train.config import ModelConfig
    from pyg_dfgnn.train.models import build_model
    from .conftest import fused_available
    if not fused_available():
        pytest.skip("pyg_dfgnn.nn is not importable")
    data = _data(n=2000, e=40000, max_deg=1500)
    data.x = torch.randint(0, 5, (2000,), generator=torch.Generator().manual_seed(2))
    ds = _device_sampler(data, [15, 10, 5], "cuda")
    b = ds.batch(_seeds(n=2000, count=256), ds.generator(0))
    # integer inputs -> embedding: the whole model runs in float64
    mc = ModelConfig(name="gat", readout="mlp", layers=3, hidden=32, heads=4)
    outs = {}
    for backend in ("fused", "pyg"):
        torch.manual_seed(0)
        m = build_model(mc, 5, 4, True, backend).to("cuda", torch.float64).eval()
        with torch.no_grad():
            outs[backend] = m(b.x, b.edge_index)[:b.batch_size]
        assert outs[backend].dtype == torch.float64
    f, p = outs["fused"], outs["pyg"]
    assert float(p.std(0).min()) > 1e-3
    torch.testing.assert_close(f, p, rtol=1e-10, atol=1e-10 * float(p.abs().max()))


@pytest.mark.parametrize("backend", ["pyg", "fused"])
@pytest.mark.parametrize("_", [pytest.param(0, id="gpu", marks=needs_cuda)])
def test_tiny_training_run_sampling_on_the_gpu(tmp_path, backend, _):
    from pyg_dfgnn.train.trainer import train
    over = [o for o in TINY_SAMPLED if not o.startswith("device=")]
    cfg = load_config(None, over + ["device=cuda", "data.sample_on=cuda",
                                    f"backend={backend}", "epochs=2",
                                    f"data.root={tmp_path / 'data'}", f"out_dir={tmp_path}"])
    r = train(cfg)
    log = (tmp_path / "train.log").read_text()
    assert "sampling: on cuda" in log and "(data.sample_on=cuda:" in log
    assert r["status"] == "completed" and len(r["history"]) == 2
    assert all(math.isfinite(h["train_loss"]) for h in r["history"])


@pytest.mark.parametrize("_", [pytest.param(0, id="gpu", marks=needs_cuda)])
def test_ddp_two_gpus_each_rank_samples_on_its_own_gpu(tmp_path, _):
    """torchrun, 2 NCCL ranks on 2 GPUs, data.sample_on=cuda: each rank samples
    its shard (90 of the 180 training seeds) on its own GPU."""
    from .conftest import torchrun_train
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    over = [o for o in TINY_SAMPLED if not o.startswith("device=")]
    p = torchrun_train([CONFIGS / "cora_gat_sampled_quick.yaml"] + over + [
                       "device=cuda", "data.sample_on=cuda", "backend=pyg", "epochs=2",
                       f"data.root={tmp_path / 'data'}", f"out_dir={tmp_path / 'run'}"],
                       timeout=300, NCCL_NVLS_ENABLE="0")
    assert "x2 ranks (DDP, nccl)" in p.stdout
    assert "sampling: on cuda:0 (data.sample_on=cuda:" in p.stdout
    assert "train seeds 90 per rank x 2" in p.stdout
    r = json.loads((tmp_path / "run" / "results.json").read_text())
    assert r["environment"]["world_size"] == 2 and len(r["history"]) == 2
    assert all(math.isfinite(h["train_loss"]) for h in r["history"])
