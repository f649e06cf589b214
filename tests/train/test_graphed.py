"""``cuda_graphs: true`` (pyg_dfgnn/train/graphed.py): batches padded to a fixed
size give the same steps as the unpadded batches.

On CPU the padded steps run eagerly (``capture=False``); the float64 checks
below are what a replay computes too, since a replay repeats the captured
kernels on the same fixed-shape buffers.  The CUDA test captures for real.
"""
import json

import numpy as np
import pytest
import torch

from pyg_dfgnn.train.cli import main

from .conftest import fused_available, saved_bytes

pytestmark = pytest.mark.skipif(not fused_available(), reason="pyg_dfgnn.nn not importable")


def _graphs(num, seed, loops=False):
    from pyg_dfgnn.data import generate_split
    gs = generate_split("PATTERN", "train", num, seed=seed)
    for g in gs:
        g.x = g.x.view(-1)
        if loops:   # a few self-loops, which the looped view replaces
            n = int(g.num_nodes)
            extra = torch.arange(0, n, 7)
            ei = torch.cat([g.edge_index, torch.stack([extra, extra])], 1)
            g.edge_index = ei[:, torch.argsort(ei[1], stable=True)]
    return gs


def _store(graphs, views):
    from pyg_dfgnn.data import GraphBatcher
    return GraphBatcher(graphs, views)


# ---------------------------------------------------------------- building blocks
def test_masked_batch_norm_is_batch_norm_of_the_real_rows():
    from pyg_dfgnn.train.models import masked_batch_norm
    torch.manual_seed(0)
    x = torch.randn(30, 5, dtype=torch.float64, requires_grad=True)
    mask = torch.arange(30) < 21
    ref = torch.nn.BatchNorm1d(5).double()
    ours = torch.nn.BatchNorm1d(5).double()
    with torch.no_grad():
        ref.weight.uniform_(0.5, 2)
        ref.bias.uniform_(-1, 1)
        ours.load_state_dict(ref.state_dict())
    w = torch.randn(21, 5, dtype=torch.float64)
    y_ref = ref(x[:21])
    (y_ref * w).sum().backward()
    g_ref = x.grad.clone()
    x.grad = None
    y = masked_batch_norm(ours, x, mask)
    (y[:21] * w).sum().backward()
    torch.testing.assert_close(y[:21], y_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(x.grad, g_ref, rtol=1e-12, atol=1e-12)   # padding rows: 0
    for k in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(getattr(ours, k), getattr(ref, k), rtol=1e-12, atol=0)
    ours.eval()
    ref.eval()
    torch.testing.assert_close(masked_batch_norm(ours, x, mask)[:21], ref(x[:21]))


def _autograd_masked_norm(bn, x, mask, elu):
    """The masked norm as plain autograd ops (what models.py computed before
    its hand-written backward): the reference of the test below."""
    m = mask.to(x.dtype).unsqueeze(-1)
    cnt = m.sum()
    mean = (x * m).sum(0) / cnt
    d = (x - mean) * m
    var = (d * d).sum(0) / cnt
    y = (x - mean) * torch.rsqrt(var + bn.eps)
    if bn.affine:
        y = y * bn.weight + bn.bias
    return torch.nn.functional.elu(y) if elu else y


@pytest.mark.parametrize("elu", [False, True])
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("real", [1, 23, 40])
def test_masked_batch_norm_backward_is_the_autograd_one(elu, affine, real):
    """The hand-written backward (it keeps only x) against autograd through
    the same forward, float64, with gradients flowing into the padding rows
    too (they are normalised with the real rows' statistics, so their
    gradient reaches the real rows' x through mean and var)."""
    from pyg_dfgnn.train.models import masked_batch_norm
    torch.manual_seed(real + 2 * elu + 4 * affine)
    bn = torch.nn.BatchNorm1d(6, affine=affine).double()
    if affine:
        with torch.no_grad():
            bn.weight.uniform_(-2, 2)
            bn.bias.uniform_(-1, 1)
    x = (3 * torch.randn(40, 6, dtype=torch.float64) + 1).requires_grad_()
    mask = torch.zeros(40, dtype=torch.bool)
    mask[torch.randperm(40)[:real]] = True
    w = torch.randn(40, 6, dtype=torch.float64)
    params = [x] + ([bn.weight, bn.bias] if affine else [])
    ref = _autograd_masked_norm(bn, x, mask, elu)
    g_ref = torch.autograd.grad((ref * w).sum(), params)
    y = masked_batch_norm(bn, x, mask, elu=elu)
    g = torch.autograd.grad((y * w).sum(), params)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    scale = max(t.abs().max().item() for t in g_ref)   # x's gradient is 0 at real=1
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12 * scale)


def test_masked_batch_norm_half_precision_input():
    """bf16 input (an autocast layer's output): statistics and backward in
    fp32, the output and x's gradient rounded to bf16.  Against float64 on the
    same bf16 values (and the bf16 upstream gradient): the bf16 tensors within
    two bf16 roundings, the fp32 weight gradient within the summation bound of
    its 50 fp32 terms."""
    from pyg_dfgnn.train.models import masked_batch_norm
    torch.manual_seed(5)
    n = 50
    bn = torch.nn.BatchNorm1d(8)
    x = torch.randn(n, 8).bfloat16().requires_grad_()
    mask = torch.arange(n) < 37
    dy = torch.randn(n, 8).bfloat16()
    y = masked_batch_norm(bn, x, mask, elu=True)
    y.backward(dy)
    assert y.dtype == x.grad.dtype == torch.bfloat16
    bn64 = torch.nn.BatchNorm1d(8).double()
    x64 = x.detach().double().requires_grad_()
    ref = _autograd_masked_norm(bn64, x64, mask, True)
    ref.backward(dy.double())
    u = 2.0 ** -8   # bf16 unit roundoff
    assert (y.double() - ref).abs().max() <= 2 * u * ref.abs().max()
    assert (x.grad.double() - x64.grad).abs().max() <= 2 * u * x64.grad.abs().max()
    xh = (x64 - x64[mask].mean(0)) / x64[mask].std(0, unbiased=False)
    bound = 4 * n * 2.0 ** -24 * (dy.double().abs() * xh.abs()).sum(0)   # ELU' <= 1
    assert ((bn.weight.grad.double() - bn64.weight.grad).abs() <= bound).all()


@pytest.mark.parametrize("weighted", [True, False])
def test_masked_cross_entropy_is_the_loss_of_the_real_rows(weighted):
    import torch.nn.functional as F
    from pyg_dfgnn.train.metrics import masked_cross_entropy, weighted_cross_entropy
    torch.manual_seed(1)
    logits = torch.randn(40, 3, dtype=torch.float64)
    y = torch.randint(0, 2, (40,))     # class 2 absent: weight 0 in the weighted loss
    mask = torch.arange(40) < 33
    y_pad = y.clone()
    y_pad[33:] = 2                     # padding labels must not count
    ref = (weighted_cross_entropy(logits[:33], y[:33], 3) if weighted
           else F.cross_entropy(logits[:33], y[:33]))
    ours = masked_cross_entropy(logits, y_pad, mask, 3, weighted)
    assert ours.item() == pytest.approx(ref.item(), rel=1e-13)


@pytest.mark.parametrize("bucket", ["worst", "exact", "loose"])
@pytest.mark.parametrize("loops", [False, True])
def test_static_views_equal_the_batch_views_on_the_real_rows(loops, bucket):
    """The CSR views built from the padded buffers are the batch's own views
    (same rows, edges and transposes), with every padding edge left out -- in
    the worst-case bucket, in a bucket of exactly the batch's totals (one
    padding node, no padding edge) and in one a little larger."""
    from pyg_dfgnn import graph as G
    from pyg_dfgnn.train.graphed import StaticBatches
    views = (False, True)
    store = _store(_graphs(6, 3, loops), views)
    ids = np.array([5, 0, 3])
    tot = StaticBatches([store], 4, torch.device("cpu"), views).totals(store, ids)
    ladder = {"worst": 1, "exact": [tot], "loose": [(tot[0] + 9, tot[1] + 7, tot[2] + 5)]}
    static = StaticBatches([store], 4, torch.device("cpu"), views, buckets=ladder[bucket])
    n = static.load(store, ids)
    assert static.bucket == (0 if bucket != "worst" else len(static.buckets) - 1)
    Nr = static.bucket_nodes(static.bucket)      # the bucket's rows, padding node last
    pad = Nr - 1
    batch = store.batch(ids)
    N = int(batch.num_nodes)
    assert n == N and Nr > N
    if bucket == "exact":
        assert Nr == N + 1
    inp = static.inputs()
    assert inp["x"].size(0) == Nr
    assert torch.equal(inp["node_mask"], torch.arange(Nr) < N)
    assert torch.equal(inp["x"][:N], batch.x) and not inp["x"][N:].any()
    ei = inp["edge_index"]
    E = batch.edge_index.size(1)
    assert ei.size(1) == static.buckets[static.bucket][1]
    assert torch.equal(ei[:, :E], batch.edge_index)
    assert bool((ei[:, E:] == pad).all())        # loops on the padding node
    for v, g in zip(views, inp["graphs"]):
        ref = G.get_graph(batch.edge_index, (N, N), N if v else None)
        assert G.get_graph(ei, (Nr,) * 2, Nr if v else None) is g      # attached
        m = int(ref.rowptr[-1])
        assert torch.equal(g.rowptr[:N + 1].long(), ref.rowptr.long())
        # padding rows: empty, or (looped view) their own loop only
        tail = torch.arange(Nr - N + 1) if v else 0
        assert torch.equal(g.rowptr[N:].long(), m + tail + torch.zeros(
            Nr - N + 1, dtype=torch.long))
        assert torch.equal(g.col[:m].long(), ref.col.long())
        assert torch.equal(g.t_rowptr[:N + 1].long(), ref.t_rowptr.long())
        assert torch.equal(g.t_col[:m].long(), ref.t_col.long())
        # the transposed edges point at the same CSR positions
        assert torch.equal(g.t_perm[:m].long(), ref.t_perm.long())


def _size_stores(seed=0):
    """Stand-ins for GraphBatchers with only what the ladder reads: per-graph
    nodes, edges and self-loops of 3000 + 600 PATTERN-like graphs."""
    from types import SimpleNamespace
    rng = np.random.default_rng(seed)
    out = []
    for g in (3000, 600):
        n = rng.integers(44, 189, g)
        e = n * rng.integers(20, 60, g)
        loops = rng.integers(0, 3, g) * (rng.random(g) < 0.3)
        out.append(SimpleNamespace(n=n, e=e, loops=loops, num_graphs=g))
    return out


def test_bucket_ladder_follows_the_rule():
    """The ladder (:func:`bucket_capacities`): ascending, ``num_buckets``
    buckets, the last the worst case (what the single capacity was), below it
    the tail bound (mean + 5 sd of random batch totals, at least their
    maximum), below that the quantiles; each rounded up to a multiple of 64;
    deterministic (seeded)."""
    from pyg_dfgnn.train.graphed import (BUCKET_ALIGN, BUCKET_QUANTILES, TAIL_SD,
                                         batch_totals, bucket_capacities, capacity,
                                         worst_case)
    stores = _size_stores()
    B = 32
    worst = worst_case(stores, B)
    assert worst[:2] == (max(capacity(s.n, B) for s in stores),
                         max(capacity(s.e, B) for s in stores))
    assert worst[2] == max(capacity(s.e - s.loops, B) for s in stores)
    tot = batch_totals(stores, B, samples=4000)
    assert tot.shape[1] == 3 and 4000 <= len(tot) <= 4100
    assert (tot <= np.asarray(worst)).all()
    assert np.array_equal(tot, batch_totals(stores, B, samples=4000))     # seeded
    tail = np.maximum(tot.max(0), tot.mean(0) + TAIL_SD * tot.std(0))
    # a batch's level: the largest share of batches at or below one of its totals
    level = np.max([(tot[None, :, j] <= tot[:, None, j]).mean(1) for j in range(3)], 0)
    for k in range(1, 6):
        ladder = bucket_capacities(stores, B, k, samples=4000)
        assert len(ladder) == k and ladder[-1] == worst
        for a, b in zip(ladder, ladder[1:]):
            assert all(x <= y for x, y in zip(a, b)) and a != b
        for i, b in enumerate(ladder[:-1]):
            if i < k - 2:
                q = BUCKET_QUANTILES[k][i]
                bound = tot[level <= np.quantile(level, q, method="higher")].max(0)
                # the bucket holds at least that share of the batches, in every total
                assert (tot <= np.asarray(b)).all(1).mean() >= q
            else:
                bound = tail
                assert (tot <= np.asarray(b)).all()
            for j in range(3):      # the smallest multiple of 64 at or above the bound
                assert b[j] % BUCKET_ALIGN == 0 and b[j] - BUCKET_ALIGN < bound[j] <= b[j]
    with pytest.raises(ValueError, match="num_buckets"):
        bucket_capacities(stores, B, 6)
    # a small data set: buckets merge with the worst case
    real = [_store(_graphs(12, 9), (True,))]
    lad = bucket_capacities(real, 5, 4)
    assert 1 <= len(lad) <= 4 and lad[-1] == worst_case(real, 5)


def test_every_batch_goes_to_the_smallest_bucket_that_holds_it():
    from pyg_dfgnn.train.graphed import StaticBatches, worst_case
    views = (True,)
    store = _store(_graphs(30, 6, loops=True), views)
    B = 4
    rng = np.random.default_rng(3)
    static = StaticBatches([store], B, torch.device("cpu"), views, buckets=4)
    assert static.buckets[-1] == worst_case([store], B)
    assert (static.num_nodes, static.e_cap) == (static.buckets[-1][0] + 1,
                                                static.buckets[-1][1])
    seen = set()
    for _ in range(200):
        ids = rng.permutation(30)[:int(rng.integers(1, B + 1))]
        t = static.totals(store, ids)
        fits = [all(x <= c for x, c in zip(t, cap)) for cap in static.buckets]
        assert fits[-1]                                    # the worst case holds all
        b = static.bucket_of(store, ids)
        assert fits[b] and not any(fits[:b])               # the smallest that holds it
        assert static.load(store, ids) == t[0] and static.bucket == b
        inp = static.inputs()
        assert inp["x"].size(0) == static.buckets[b][0] + 1
        assert inp["edge_index"].size(1) == static.buckets[b][1]
        seen.add(b)
    assert len(seen) >= 2
    static.load(store, np.argsort(store.n)[-B:])
    with pytest.raises(ValueError, match="'bucket' must be in"):
        static.inputs(0)                          # would cut the batch
    # the heaviest batch is in the last bucket
    heavy = np.argsort(store.n)[-B:]
    assert static.bucket_of(store, heavy) == len(static.buckets) - 1
    one = StaticBatches([store], B, torch.device("cpu"), views, buckets=1)
    assert one.buckets == [static.buckets[-1]]
    with pytest.raises(ValueError, match="ascending"):
        StaticBatches([store], B, torch.device("cpu"), views, buckets=[(500, 900), (400, 1000)])
    with pytest.raises(TypeError, match="buckets"):
        StaticBatches([store], B, torch.device("cpu"), views, buckets="4")


def _adam_graphed(model, views, batches_ids, store, dtype, graphed: bool, buckets=1,
                  eval_ids=None, info=None):
    """Losses of Adam steps on the store's batches, the evaluation (loss,
    logits) of batches ``eval_ids`` (default: the first batch), then the
    parameters and the BatchNorm running statistics: padded GraphedSteps in
    ``buckets`` (``graphed=True`` eager, ``"fake"``: with the capture schedule
    of a CUDA run, see :func:`_fake_capture`) or eager batches."""
    from pyg_dfgnn.train.config import load_config
    from pyg_dfgnn.train.graphed import GraphedSteps, StaticBatches
    from pyg_dfgnn.train.metrics import masked_cross_entropy, weighted_cross_entropy
    from pyg_dfgnn.train.models import build_model
    from .conftest import CONFIGS
    cfg = load_config(str(CONFIGS / "pattern_gat_quick.yaml"),
                      [f"model.name={model}", "model.hidden=16", "model.heads=2",
                       "model.layers=2", "model.dropout=0.2"])
    eval_ids = [batches_ids[0]] if eval_ids is None else eval_ids
    torch.manual_seed(0)
    net = build_model(cfg.model, 3, 2, True, "fused").to(dtype)
    opt = torch.optim.Adam(net.parameters(), lr=5e-3)
    losses, vals = [], []
    torch.manual_seed(7)   # the dropout masks: padded rows draw too, so compare without
    if graphed:
        static = StaticBatches([store], 4, torch.device("cpu"), views, buckets=buckets)
        steps = GraphedSteps(net, opt, static,
                             lambda o, y, m: masked_cross_entropy(o, y, m, 2, True),
                             lambda: __import__("contextlib").nullcontext(),
                             capture=graphed == "fake")
        for ids in batches_ids:
            _, loss, _ = steps.train_step(store, ids)
            losses.append(loss.item())
        for ids in eval_ids:
            out, loss, n = steps.eval_step(store, ids)
            vals.append((loss.item(), out[:n].clone()))
        if info is not None:
            info["steps"], info["opt"] = steps, opt
    else:
        for ids in batches_ids:
            b = store.batch(ids)
            net.train()
            loss = weighted_cross_entropy(net(b.x, b.edge_index), b.y, 2)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        net.eval()
        for ids in eval_ids:
            b = store.batch(ids)
            with torch.no_grad():
                out = net(b.x, b.edge_index)
                vals.append((weighted_cross_entropy(out, b.y, 2).item(), out))
    return losses, vals, {k: v.detach().clone() for k, v in net.state_dict().items()}


def _assert_same_steps(ref, pad):
    """Float64 equality of two :func:`_adam_graphed` results (tolerance: float64
    rounding amplified as in tests/train/test_train_e2e.py, <= 1e-9)."""
    (l_ref, v_ref, s_ref), (l_pad, v_pad, s_pad) = ref, pad
    assert l_pad == pytest.approx(l_ref, rel=1e-10)
    assert len(v_pad) == len(v_ref)
    for (a_loss, a_out), (b_loss, b_out) in zip(v_ref, v_pad):
        assert b_loss == pytest.approx(a_loss, rel=1e-10)
        torch.testing.assert_close(b_out, a_out, rtol=1e-9, atol=1e-9)
    assert s_pad.keys() == s_ref.keys()
    for k in s_ref:
        torch.testing.assert_close(s_pad[k], s_ref[k], rtol=1e-9, atol=1e-9, msg=k)


@pytest.mark.parametrize("model", ["gat", "gt", "agnn"])
def test_padded_steps_equal_the_eager_steps_in_float64(model, monkeypatch):
    """Three Adam steps (train mode, BatchNorm) and an eval forward on padded
    fixed-size batches equal those on the batches themselves, in float64: the
    padding changes nothing but the summation order (tolerance: float64
    rounding amplified as in tests/train/test_train_e2e.py, <= 1e-9)."""
    import torch.nn.functional as F
    from pyg_dfgnn.data.prepare import PrepareGraphs  # noqa: F401  (views of the model)
    # without dropout: padded batches have more rows, so the dropout draws differ
    monkeypatch.setattr(F, "dropout", lambda x, p=0.5, training=True, inplace=False: x)
    views = (model != "gt",)
    store = _store(_graphs(8, 5, loops=True), views)
    ids = [np.array([0, 1, 2, 3]), np.array([4, 5, 6]), np.array([7, 2])]
    _assert_same_steps(_adam_graphed(model, views, ids, store, torch.float64, False),
                       _adam_graphed(model, views, ids, store, torch.float64, True))


class _FakeGraph:
    """A CUDA graph's stand-in on CPU: :meth:`replay` runs the captured body
    again and writes its results into the captured outputs (what a replay
    does: same buffers, same outputs)."""

    def __init__(self, body, outs):
        self.body, self.outs, self.replays = body, outs, 0

    def replay(self):
        self.replays += 1
        for o, new in zip(self.outs, self.body()):
            o.copy_(new)


def _state(model, opt):
    """Copies of everything a step or a dry run could change: the parameters,
    the optimiser state and every module buffer (BatchNorm statistics)."""
    opt_state = [(i, k, v.detach().clone() if torch.is_tensor(v) else v)
                 for i, st in enumerate(opt.state.values()) for k, v in sorted(st.items())]
    return ([p.detach().clone() for p in model.parameters()], opt_state,
            [(n, b.detach().clone()) for n, b in model.named_buffers()])


def _assert_same_state(a, b):
    """Bit-identical :func:`_state` results."""
    assert len(a[0]) == len(b[0]) and all(torch.equal(x, y) for x, y in zip(a[0], b[0]))
    assert len(a[1]) == len(b[1])
    for (i, k, x), (j, m, y) in zip(a[1], b[1]):
        assert (i, k) == (j, m)
        assert torch.equal(x, y) if torch.is_tensor(x) else x == y, k
    assert [n for n, _ in a[2]] == [n for n, _ in b[2]]
    for (n, x), (_, y) in zip(a[2], b[2]):
        assert torch.equal(x, y), n


def _restore(model, opt, state):
    with torch.no_grad():
        for p, v in zip(model.parameters(), state[0]):
            p.copy_(v)
        sts = list(opt.state.values())
        for i, k, v in state[1]:
            if torch.is_tensor(v):
                sts[i][k].copy_(v)
            else:
                sts[i][k] = v
        bufs = dict(model.named_buffers())
        for n, v in state[2]:
            bufs[n].copy_(v)


def _fake_capture(monkeypatch):
    """GraphedSteps with ``capture=True`` on CPU: its schedule (which step runs
    eagerly, which captures, which replays) with :class:`_FakeGraph` objects.
    A capture records and runs nothing: the fake runs the body for its outputs
    and puts back parameters, optimiser state and buffers; a replay rewrites
    the gradients the capture allocated (``zero_grad``)."""
    from pyg_dfgnn.train.graphed import GraphedSteps

    def capture(self, body):
        def run():
            self.opt.zero_grad(set_to_none=True)
            return body()
        before = _state(self.model, self.opt)
        outs = tuple(o.clone() for o in run())
        _restore(self.model, self.opt, before)
        g = _FakeGraph(run, outs)
        return g, g.outs

    monkeypatch.setattr(GraphedSteps, "_capture", capture)
    monkeypatch.setattr(GraphedSteps, "_side_stream",
                        lambda self: __import__("contextlib").nullcontext())


def _three_buckets(store, views):
    """Batches S, M, L of the 8-graph store and the ladder: S exactly (one
    padding node, no padding edge), one holding S and M but not L, the worst
    case."""
    from pyg_dfgnn.train.graphed import StaticBatches
    S, M, L = np.array([7, 2]), np.array([4, 5, 6]), np.array([0, 1, 2, 3])
    probe = StaticBatches([store], 4, torch.device("cpu"), views)
    tS, tM, tL = (probe.totals(store, i) for i in (S, M, L))
    mid = tuple(max(a, b) + 3 for a, b in zip(tS, tM))             # holds S and M
    assert not all(x <= y for x, y in zip(tL, mid))                # L does not fit
    return (S, M, L), [tS, mid]


@pytest.mark.parametrize("model,mode", [("gat", "fake"), ("gt", "fake"), ("agnn", True)])
def test_bucketed_steps_equal_the_eager_steps_in_float64(model, mode, monkeypatch):
    """Batches in three buckets -- one of exactly a batch's totals (a single
    padding node, no padding edge), one larger, the worst case -- give the
    unpadded eager steps in float64, eagerly and with the capture schedule of
    a CUDA run (``fake``: warm-up, dry runs, captures, replays; every batch
    exactly one optimiser step).  The dry runs are in both (``capture=False``
    runs the same schedule), so they change nothing the steps compute."""
    import torch.nn.functional as F
    from pyg_dfgnn.train import graphed
    monkeypatch.setattr(F, "dropout", lambda x, p=0.5, training=True, inplace=False: x)
    if mode == "fake":
        _fake_capture(monkeypatch)
    monkeypatch.setattr(graphed, "WARMUP_STEPS", 1)
    views = (model != "gt",)
    store = _store(_graphs(8, 5, loops=True), views)
    (S, M, L), buckets = _three_buckets(store, views)
    train = [S, L, S, S, L, M, L, S, M, M]
    evals = [S, S, S, L, L, L, M]
    info = {}
    ref = _adam_graphed(model, views, train, store, torch.float64, False, eval_ids=evals)
    pad = _adam_graphed(model, views, train, store, torch.float64, mode, buckets=buckets,
                        eval_ids=evals, info=info)
    _assert_same_steps(ref, pad)
    steps, opt = info["steps"], info["opt"]
    K = len(steps.static.buckets)
    bS, bM, bL = (steps.static.bucket_of(store, i) for i in (S, M, L))
    assert bS == 0 and bM == 1 and bL == K - 1 and K == 3
    assert steps.train_counts == [4, 3, 3] and steps.eval_counts == [3, 1, 3]
    for st in opt.state.values():                      # one optimiser step per batch
        assert int(st["step"]) == len(train)
    # train S L S S L M L S M M (1 warm-up step): S eager; at L the capture point:
    # the worst case (L needs it), then M's and S's buckets, descending, each
    # after a dry run unless its shapes ran (S's did, in the warm-up); all the
    # rest are replays.  Eval S S S L L L M: at the first one the buckets below
    # the worst case, descending, each after an eval dry run; the worst case at
    # the first L.  No graph twice (no restarts).
    assert steps.schedule == [("dry-train", 2), ("train", 2), ("dry-train", 1), ("train", 1),
                              ("train", 0), ("dry-eval", 1), ("eval", 1), ("dry-eval", 0),
                              ("eval", 0), ("dry-eval", 2), ("eval", 2)]
    assert steps.dry_runs == 5
    if mode == "fake":
        assert steps.captured == {"train": [0, 1, 2], "eval": [0, 1, 2]}
        assert [steps.train_graphs[b].replays for b in range(3)] == [3, 3, 3]
        assert [steps.eval_graphs[b].replays for b in range(3)] == [3, 1, 3]
        assert steps.captures == 6
    else:
        assert steps.captured == {"train": [], "eval": []} and steps.captures == 0


@pytest.mark.parametrize("mode", ["fake", True])
def test_capture_point_takes_every_bucket_but_the_worst_case(mode, monkeypatch):
    """The capture schedule (GT: BatchNorm, with dropout): after the warm-up the
    buckets below the worst case are captured at once, in descending order,
    the worst case only when a batch needs it; no eager step after the
    warm-up (one optimiser step per batch); the dry runs before the captures,
    and the whole capture point, leave parameters, optimiser state and all
    module buffers bit-identical (a training-mode forward without the saved
    buffers would move BatchNorm's statistics: checked too).  ``True``: the
    same schedule without capture, as on CPU."""
    from pyg_dfgnn.train import graphed
    from pyg_dfgnn.train.graphed import GraphedSteps
    if mode == "fake":
        _fake_capture(monkeypatch)
    monkeypatch.setattr(graphed, "WARMUP_STEPS", 2)
    views = (False,)
    store = _store(_graphs(8, 5, loops=True), views)
    (S, M, L), buckets = _three_buckets(store, views)
    checks = {"dry": 0, "arm": 0, "eager": 0}

    def unchanged(name, fn):
        def wrapped(self, *a, **k):
            before = _state(self.model, self.opt)
            r = fn(self, *a, **k)
            _assert_same_state(before, _state(self.model, self.opt))
            checks[name] += 1
            return r
        return wrapped

    for name, fn in (("dry", GraphedSteps._dry_train), ("dry", GraphedSteps._dry_eval),
                     ("arm", GraphedSteps._arm)):
        monkeypatch.setattr(GraphedSteps, fn.__name__, unchanged(name, fn))
    body = GraphedSteps._train_body

    def counted(self, bucket):
        checks["eager"] += 1
        return body(self, bucket)
    monkeypatch.setattr(GraphedSteps, "_train_body", counted)
    # without the saved buffers a dry run moves BatchNorm's statistics
    monkeypatch.setattr(GraphedSteps, "_keep_buffers",
                        lambda self: __import__("contextlib").nullcontext())
    with pytest.raises(AssertionError, match="running_mean|running_var|num_batches"):
        _adam_graphed("gt", views, [M, M, S], store, torch.float32, mode, buckets=buckets)
    monkeypatch.undo()
    if mode == "fake":
        _fake_capture(monkeypatch)
    monkeypatch.setattr(graphed, "WARMUP_STEPS", 2)
    for name, fn in (("dry", GraphedSteps._dry_train), ("dry", GraphedSteps._dry_eval),
                     ("arm", GraphedSteps._arm)):
        monkeypatch.setattr(GraphedSteps, fn.__name__, unchanged(name, fn))
    monkeypatch.setattr(GraphedSteps, "_train_body", counted)
    checks.update(dry=0, arm=0, eager=0)
    info = {}
    train = [M, M, S, M, S, M]                 # the worst case never needed
    evals = [M, S, M]
    _adam_graphed("gt", views, train, store, torch.float32, mode, buckets=buckets,
                  eval_ids=evals, info=info)
    steps, opt = info["steps"], info["opt"]
    # warm-up M M; at S the capture point: M's bucket (its shapes ran: no dry
    # run), S's (dry run on S, loaded back after)
    assert steps.schedule == [("train", 1), ("dry-train", 0), ("train", 0),
                              ("dry-eval", 1), ("eval", 1), ("dry-eval", 0), ("eval", 0)]
    assert checks["dry"] == steps.dry_runs == 3 and checks["arm"] == 2
    # eager: the 2 warm-up steps only (capture=False: every step), the fake's
    # captures run their bodies too (and put the state back)
    n_eager = len(train) if mode is True else 2 + 2 + sum(
        g.replays for g in steps.train_graphs.values())
    assert checks["eager"] == n_eager
    for st in opt.state.values():
        assert int(st["step"]) == len(train)
    if mode == "fake":
        assert steps.captured == {"train": [0, 1], "eval": [0, 1]} and steps.captures == 4
        assert [steps.train_graphs[b].replays for b in (0, 1)] == [2, 2]
    # the worst case comes when a batch needs it: dry run, capture, replay
    steps.train_step(store, L)
    steps.eval_step(store, L)
    assert steps.schedule[-4:] == [("dry-train", 2), ("train", 2), ("dry-eval", 2),
                                   ("eval", 2)]
    assert checks["arm"] == 4 and checks["dry"] == 5
    for st in opt.state.values():
        assert int(st["step"]) == len(train) + 1
    if mode == "fake":
        assert steps.captured == {"train": [0, 1, 2], "eval": [0, 1, 2]}
        assert steps.captures == 6 and steps.train_graphs[2].replays == 1


def test_a_bucket_no_graph_of_the_batch_fits_waits_for_a_batch(monkeypatch):
    """At the capture point a bucket below the loaded batch's is dry-run and
    captured on the batch's graphs that fit it; where not one does, it is
    left for later like the worst case, and captured when a batch needs it."""
    from pyg_dfgnn.train import graphed
    _fake_capture(monkeypatch)
    monkeypatch.setattr(graphed, "WARMUP_STEPS", 1)
    views = (True,)
    store = _store(_graphs(8, 5, loops=True), views)
    (S, M, L), (tS, mid) = _three_buckets(store, views)
    small = np.argmin(store.n)                     # the smallest graph
    one = graphed.StaticBatches([store], 4, torch.device("cpu"), views).totals(
        store, [small])
    assert small not in M and all(store.n[i] > one[0] for i in M)   # none of M fits
    info = {}
    _adam_graphed("gat", views, [M, M, np.array([small])], store, torch.float32, "fake",
                  buckets=[one, mid], eval_ids=[M], info=info)
    steps = info["steps"]
    # warm-up M; capture point at M: M's bucket, bucket 0 skipped; the batch of
    # the smallest graph alone captures it (dry run first: its shapes never ran)
    assert steps.schedule == [("train", 1), ("dry-train", 0), ("train", 0),
                              ("dry-eval", 1), ("eval", 1)]
    assert steps.captured == {"train": [0, 1], "eval": [1]} and steps.captures == 3
    for st in info["opt"].state.values():
        assert int(st["step"]) == 3


# ---------------------------------------------------------------- trainer
def _results(path):
    with open(path / "results.json") as f:
        return json.load(f)


@pytest.mark.parametrize("model", ["gat", "gt"])
def test_trainer_runs_the_padded_steps(tmp_path, tiny_args, model, monkeypatch, capsys):
    """``cuda_graphs: true`` through the CLI (padded steps, eager on CPU): the
    same steps and the same training losses as the plain run, up to float32
    summation order (measured: 1e-7 relative; a masking error -- BatchNorm or
    the loss counting padding rows -- moves them by far more than 1e-4).  The
    validation loss is only compared loosely: it reads BatchNorm's running mean,
    which follows the conv biases in front of BatchNorm, whose gradient is zero
    in exact arithmetic; Adam scales their float32 rounding noise up to steps of
    ~lr, differently for any other summation order (the float64 tests above
    compare everything exactly)."""
    from pyg_dfgnn.train.trainer import _Run
    monkeypatch.setattr(_Run, "cuda_graphs_on_cpu", True)
    extra = ["epochs=2", f"model.name={model}", "backend=fused", "model.dropout=0.0"]
    assert main(tiny_args(*extra, out="plain")) == 0
    assert main(tiny_args(*extra, "cuda_graphs=true", out="graphed")) == 0
    assert "cuda_graphs: batches padded to" in capsys.readouterr().out
    ref, ours = _results(tmp_path / "plain"), _results(tmp_path / "graphed")
    for a, b in zip(ref["history"], ours["history"]):
        assert a["steps"] == b["steps"]
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-4)
        assert b["val_loss"] == pytest.approx(a["val_loss"], rel=1e-2)
    cg = ours["training"]["cuda_graphs"]
    buckets = cg["cuda_graph_buckets"]
    assert 1 <= len(buckets) <= 4 and cg["captured"] is False and cg["captures"] == 0
    assert isinstance(cg["dry_runs"], int)    # the CPU path runs the schedule's dry runs too
    assert (buckets[-1]["num_nodes"], buckets[-1]["num_edges"]) == (cg["num_nodes"],
                                                                    cg["num_edges"])
    assert sum(b["train_steps"] for b in buckets) == sum(h["steps"] for h in ours["history"])
    assert not any(b["captured_train"] or b["captured_eval"] for b in buckets)


@pytest.mark.parametrize("override,fragment", [
    ("precision=fp16", "cuda_graphs: precision=fp16"),
    ("compile=true", "cuda_graphs: use either compile or cuda_graphs"),
    ("optimizer.name=sgd", "cuda_graphs: optimizer.name=sgd"),
    ("data.batcher=pyg", "cuda_graphs: needs data.batcher"),
    ("model.attn_dropout=0.1", "cuda_graphs: the fused attention dropout"),
    ("device=cpu", "cuda_graphs: needs a CUDA device (device=cpu)"),
    ("cuda_graph_buckets=0", "cuda_graph_buckets: must be 1..5"),
    ("cuda_graph_buckets=6", "cuda_graph_buckets: must be 1..5"),
    ("cuda_graph_buckets=two", "cuda_graph_buckets"),
])
def test_config_errors(tmp_path, tiny_args, capsys, override, fragment):
    assert main(tiny_args("cuda_graphs=true", override)) == 2
    assert fragment in capsys.readouterr().err


def test_auto_takes_the_padded_steps_where_it_can(tmp_path, tiny_args, monkeypatch,
                                                   capsys):
    """``cuda_graphs: auto`` on a run that allows it takes the padded
    (captured on CUDA) steps, with the same losses as ``cuda_graphs: true``."""
    from pyg_dfgnn.train.trainer import _Run
    monkeypatch.setattr(_Run, "cuda_graphs_on_cpu", True)
    extra = ["epochs=1", "backend=fused", "model.dropout=0.0"]
    assert main(tiny_args(*extra, "cuda_graphs=true", out="true")) == 0
    assert main(tiny_args(*extra, "cuda_graphs=auto", out="auto")) == 0
    out = capsys.readouterr().out
    assert out.count("cuda_graphs: batches padded to") == 2 and "auto -> eager" not in out
    a, b = _results(tmp_path / "true"), _results(tmp_path / "auto")
    assert b["training"]["cuda_graphs"] is not None
    assert b["training"]["cuda_graphs_requested"] == "auto"
    assert b["training"]["cuda_graphs_off"] is None
    assert [h["train_loss"] for h in b["history"]] == [h["train_loss"] for h in a["history"]]


@pytest.mark.parametrize("override,fragment", [
    ("precision=fp16", "precision=fp16 needs a GradScaler"),
    ("optimizer.name=sgd", "optimizer.name=sgd has no capturable"),
    ("data.batcher=pyg", "needs data.batcher"),
    ("backend=pyg", "backend=pyg: auto captures the fused layers only"),
    ("cpu", "needs a CUDA device; the run is on cpu"),
])
def test_auto_falls_back_to_eager_steps(tmp_path, tiny_args, monkeypatch, capsys, override,
                                        fragment):
    """``cuda_graphs: auto`` where ``true`` would be refused (or on a backend
    it does not capture): the eager steps, the reason in the log and in
    results.json, and the plain run's losses."""
    from pyg_dfgnn.train.trainer import _Run
    if override == "cpu":
        override = "epochs=1"
    else:
        monkeypatch.setattr(_Run, "cuda_graphs_on_cpu", True)   # only the override rules out
    extra = ["epochs=1", "model.dropout=0.0", override]
    assert main(tiny_args(*extra, out="plain")) == 0
    assert main(tiny_args(*extra, "cuda_graphs=auto", out="auto")) == 0
    out = capsys.readouterr().out
    assert f"cuda_graphs: auto -> eager steps (" in out and fragment in out
    assert "cuda_graphs: batches padded to" not in out
    ref, ours = _results(tmp_path / "plain"), _results(tmp_path / "auto")
    assert ours["training"]["cuda_graphs"] is None
    assert fragment in ours["training"]["cuda_graphs_off"]
    assert [h["train_loss"] for h in ours["history"]] == [h["train_loss"]
                                                          for h in ref["history"]]


def test_auto_falls_back_when_the_data_rules_it_out(tmp_path, tiny_args, monkeypatch,
                                                    capsys):
    """What only the data can rule out (here: a node degree above the
    schedule's split threshold) makes ``true`` exit 2 and ``auto`` run eager
    steps with a non-capturable optimizer."""
    from pyg_dfgnn import schedule
    from pyg_dfgnn.train.trainer import _Run
    monkeypatch.setattr(_Run, "cuda_graphs_on_cpu", True)
    monkeypatch.setattr(schedule, "MIN_SPLIT", 1)
    assert main(tiny_args("epochs=1", "cuda_graphs=true")) == 2
    assert "cuda_graphs: a graph has a node of degree" in capsys.readouterr().err
    assert main(tiny_args("epochs=1", "cuda_graphs=auto", out="auto")) == 0
    assert "cuda_graphs: auto -> eager steps (a graph has a node of degree" in \
        capsys.readouterr().out
    assert _results(tmp_path / "auto")["training"]["cuda_graphs"] is None


@pytest.mark.parametrize("value", ["maybe", "yes please"])
def test_cuda_graphs_value_is_checked(tmp_path, tiny_args, capsys, value):
    assert main(tiny_args(f"cuda_graphs={value}")) == 2
    assert "cuda_graphs: must be true, false or auto" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU refusal")
def test_cpu_run_is_refused(tmp_path, tiny_args, capsys):
    assert main(tiny_args("cuda_graphs=true", "epochs=1")) == 2
    assert "cuda_graphs: needs a CUDA device; the run is on cpu" in capsys.readouterr().err


# ---------------------------------------------------------------- CUDA
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("model", ["gat", "gt", "agnn"])
def test_replayed_steps_equal_the_eager_padded_steps_on_cuda(model):
    """Captured and replayed steps compute what the same padded steps compute
    eagerly on the GPU (the same kernels on the same buffers), in three size
    buckets of one run (their graphs share one memory pool), and nothing syncs
    inside a step (a sync would fail the capture).  The capture schedule: the
    two buckets below the worst case at the capture point (the middle one
    after a dry run), the worst case later when a batch needs it (a dry run,
    then a capture into the same pool); no graph captured twice; the capture
    points (dry runs, captures, loads) leave parameters, optimiser state and
    buffers bit-identical."""
    from pyg_dfgnn.train.config import load_config
    from pyg_dfgnn.train.graphed import WARMUP_STEPS, GraphedSteps, StaticBatches
    from pyg_dfgnn.train.metrics import masked_cross_entropy
    from pyg_dfgnn.train.models import build_model
    from .conftest import CONFIGS
    dev = torch.device("cuda")
    views = (model != "gt",)
    store = _store(_graphs(12, 2, loops=True), views)
    cfg = load_config(str(CONFIGS / "pattern_gat_quick.yaml"),
                      [f"model.name={model}", "model.hidden=16", "model.heads=2",
                       "model.layers=2", "model.dropout=0.0"])
    order = np.argsort(store.n)
    S, L = order[:2], order[-4:]               # the smallest pair, the largest four
    probe = StaticBatches([store], 4, torch.device("cpu"), views)
    tS = probe.totals(store, S)
    mid = tuple(max(a, b) + 64 for a, b in zip(tS, probe.totals(store, order[2:4])))
    buckets = [tS, mid]                        # S exactly; then a middle one; worst case
    rng = np.random.default_rng(0)
    rand = [rng.permutation(12)[:int(rng.integers(2, 5))] for _ in range(6)]
    # warm-up in S, the capture point at S (buckets 0 and 1), L's lazy capture
    batches = [S] * WARMUP_STEPS + [S, L, S, L, S, L] + rand + [L, S]
    evals = [S, S, S, L, L, L] + rand[:3]

    def run(capture):
        torch.manual_seed(0)
        net = build_model(cfg.model, 3, 2, True, "fused").to(dev)
        opt = torch.optim.Adam(net.parameters(), lr=torch.tensor(5e-3, device=dev),
                               capturable=True, fused=True)
        static = StaticBatches([store], 4, dev, views, buckets=buckets)
        assert len(static.buckets) == 3
        steps = GraphedSteps(net, opt, static,
                             lambda o, y, m: masked_cross_entropy(o, y, m, 2, True),
                             lambda: __import__("contextlib").nullcontext(), capture)
        arm = steps._arm

        def checked_arm(*a):
            before = _state(net, opt)
            arm(*a)
            torch.cuda.synchronize()
            _assert_same_state(before, _state(net, opt))
        steps._arm = checked_arm
        losses, outs = [], []
        for ids in batches:
            out, loss, n = steps.train_step(store, ids)
            losses.append(float(loss))
            outs.append(out[:n].float().cpu())     # read before the next step
        evals_ = [float(steps.eval_step(store, ids)[1]) for ids in evals]
        cap = steps.captured
        assert steps.schedule[:3] == [("dry-train", 1), ("train", 1), ("train", 0)]
        assert steps.schedule[3:5] == [("dry-train", 2), ("train", 2)]
        assert ("eval", 2) in steps.schedule and len(set(steps.schedule)) == len(
            steps.schedule)                        # nothing twice
        if capture:
            assert cap == {"train": [0, 1, 2], "eval": [0, 1, 2]}
            assert steps.captures == 6
        else:
            assert cap == {"train": [], "eval": []} and steps.captures == 0
        for st in opt.state.values():              # one optimiser step per batch
            assert int(st["step"]) == len(batches)
        return losses, outs, evals_, {k: v.detach().clone() for k, v in net.state_dict().items()}

    # GAT's default backward adds its destination rows' sums atomically (not
    # bit-reproducible: ulp-level gradient differences, which Adam's steps
    # grow); with deterministic algorithms it takes the stored backward, which
    # the replays and the eager steps compute alike.  (The atomic backward
    # under capture: tests/ops/test_cuda_kernels.py.)
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        l_e, o_e, v_e, s_e = run(False)
        l_g, o_g, v_g, s_g = run(True)
    finally:
        torch.use_deterministic_algorithms(was)
    assert l_g == pytest.approx(l_e, rel=1e-5)
    assert v_g == pytest.approx(v_e, rel=1e-5)
    for a, b in zip(o_e, o_g):    # a replay's outputs are its own batch's
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    for k in s_e:
        torch.testing.assert_close(s_g[k], s_e[k], rtol=1e-4, atol=1e-5, msg=k)


def test_attention_backward_value_is_checked(tiny_args, capsys):
    assert main(tiny_args("attention_backward=fast")) == 2
    assert "attention_backward" in capsys.readouterr().err


def test_attention_backward_is_set_for_the_run_only(tmp_path, tiny_args, monkeypatch):
    """The run forces the fused backward's mode while it trains (recorded in
    results.json) and gives the previous setting back."""
    from pyg_dfgnn.ops import fused
    seen = []
    real = fused.set_backward_mode
    monkeypatch.setattr(fused, "set_backward_mode", lambda m: seen.append(m) or real(m))
    assert main(tiny_args("attention_backward=recompute", "epochs=1")) == 0
    assert seen == ["recompute", None]
    res = json.loads((tmp_path / "run" / "results.json").read_text())
    assert res["training"]["attention_backward"] == "recompute"


@pytest.mark.parametrize("name", ["gt", "gat"])
def test_padded_step_saves_no_more_than_the_plain_one(name):
    """The masked BatchNorm of the padded steps keeps for backward what
    ``torch.nn.BatchNorm1d`` keeps (its input), plus the ``[N, 1]`` mask and
    ``[C]`` statistics per norm; with the ELU fused, GAT keeps less than its
    plain step (no ELU output).  Written as autograd ops it kept three
    ``[N, C]`` fp32 tensors per norm (here GT saved 36 % more, GAT 33 %)."""
    from types import SimpleNamespace as NS
    from pyg_dfgnn.data.sbm import pattern_like_batch
    from pyg_dfgnn.train.models import build_model
    common = dict(readout="mlp", batch_norm=True, residual=True, dropout=0.0, in_dropout=0.0,
                  attn_dropout=0.0)
    if name == "gt":
        m = NS(name="gt", layers=3, hidden=32, out_dim=32, heads=4, layer_norm=False,
               lap_pe=False, lap_pe_dim=2, **common)
    else:
        m = NS(name="gat", layers=3, hidden=32, out_dim=32, heads=4, self_loops=True,
               out_heads=1, **common)
    torch.manual_seed(0)
    model = build_model(m, 3, 2, True, "fused")
    batch = pattern_like_batch(6, seed=0)
    N = int(batch.num_nodes)
    x = torch.randint(0, 3, (N,))

    plain = saved_bytes(model, x, batch.edge_index, node_mask=None)
    padded = saved_bytes(model, x, batch.edge_index, node_mask=torch.ones(N, dtype=torch.bool))
    norms = sum(isinstance(mod, torch.nn.BatchNorm1d) for mod in model.modules())
    extra = norms * (N + 4 * 32 + 1) * 4     # mask [N, 1], mean / invstd / weight / bias, cnt
    assert padded <= plain + extra, (padded, plain, extra)
    if name == "gat":
        assert padded < plain


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_runs_in_one_process_share_the_side_stream(tiny_args):
    """Graphed runs one after another in a process (a sweep, ``dfgnn bench``'s
    training section) use the process's one side stream per device, so no run
    leaves a cuBLAS workspace (32-65 MiB) allocated behind it; measured
    before: +65 MiB of allocated memory per run."""
    from pyg_dfgnn.train import graphed
    args = ("cuda_graphs=true", "device=cuda", "backend=fused", "epochs=1",
            "model.dropout=0.0", "checkpoint.enabled=false")
    assert main(tiny_args(*args, out="a")) == 0
    torch.cuda.synchronize()
    first, streams = torch.cuda.memory_allocated(), dict(graphed._SIDE_STREAMS)
    assert len(streams) == 1
    assert main(tiny_args(*args, out="b")) == 0
    torch.cuda.synchronize()
    assert graphed._SIDE_STREAMS == streams
    assert torch.cuda.memory_allocated() - first < 16 * 2**20
