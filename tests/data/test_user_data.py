"""A user's node-level graph (data.name=file / pyg): checks, masks, random split."""
import pytest
import torch
from torch_geometric.data import Data

from pyg_dfgnn.data.datasets import DEFAULT_SPLIT, node_data_bundle, random_split
from pyg_dfgnn.train.config import ConfigError


def _graph(n=30, e=120, seed=0, **extra):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, e), generator=g)
    return Data(x=torch.randn(n, 4, generator=g), edge_index=ei,
                y=torch.randint(0, 3, (n,), generator=g), **extra)


def _bundle(obj, **kw):
    return node_data_bundle(obj, "g", "file g.pt", "data.path", log=lambda m: None, **kw)


def test_random_split_sizes_disjoint_and_seeded():
    masks = random_split(103, DEFAULT_SPLIT, torch.Generator().manual_seed(1))
    sizes = [int(m.sum()) for m in masks]
    assert sizes == [int(0.6 * 103), int(0.2 * 103), 103 - int(0.6 * 103) - int(0.2 * 103)]
    assert int(sum(m.long() for m in masks).max()) == 1          # disjoint, all covered
    again = random_split(103, DEFAULT_SPLIT, torch.Generator().manual_seed(1))
    assert all(torch.equal(a, b) for a, b in zip(masks, again))
    other = random_split(103, DEFAULT_SPLIT, torch.Generator().manual_seed(2))
    assert not torch.equal(masks[0], other[0])
    # fractions summing to < 1: int(f * n) each, the rest unused
    part = random_split(100, (0.5, 0.1, 0.05), torch.Generator().manual_seed(0))
    assert [int(m.sum()) for m in part] == [50, 10, 5]
    # only the candidate (labelled) nodes are split
    cand = torch.arange(0, 100, 2)
    sub = random_split(100, DEFAULT_SPLIT, torch.Generator().manual_seed(0), cand)
    assert int(sum(m.long() for m in sub)[1::2].sum()) == 0 and int(sub[0].sum()) == 30
    with pytest.raises(ValueError, match="fractions"):
        random_split(10, (0.9, 0.2, 0.1))


def test_masks_kept_or_split_made():
    d = _graph()
    b = _bundle(d, split_seed=3)
    assert b.kind == "full" and b.num_classes == int(d.y.max()) + 1 and b.in_dim == 4
    assert b.stats["train/val/test"] == [18, 6, 6] and "random 60/20/20 % split" in b.source
    b2 = _bundle(d, split_seed=3)
    assert torch.equal(b.data.train_mask, b2.data.train_mask)
    masks = {k: torch.rand(30, generator=torch.Generator().manual_seed(i)) < 0.3
             for i, k in enumerate(("train_mask", "val_mask", "test_mask"))}
    b = _bundle(_graph(**masks))
    assert all(torch.equal(b.data[k], m) for k, m in masks.items())
    assert "its train/val/test masks" in b.source
    # a dict works too; [N, K] masks: first column; y [N, 1] squeezed
    two = {k: torch.stack([m, ~m], 1) for k, m in masks.items()}
    d = _graph()
    b = _bundle(dict(x=d.x, edge_index=d.edge_index, y=d.y.view(-1, 1), **two))
    assert torch.equal(b.data.val_mask, masks["val_mask"]) and b.data.y.dim() == 1
    # unlabelled nodes (y < 0) are left out of the random split
    d = _graph()
    d.y[::3] = -1
    b = _bundle(d)
    chosen = b.data.train_mask | b.data.val_mask | b.data.test_mask
    assert not bool(chosen[::3].any()) and int(chosen.sum()) == 20


def test_integer_features_are_categorical():
    d = _graph()
    d.x = torch.randint(0, 7, (30,))
    b = _bundle(d)
    assert b.categorical and b.in_dim == int(d.x.max()) + 1


@pytest.mark.parametrize("change,match", [
    (lambda d: delattr(d, "y"), r"has no 'y'"),
    (lambda d: delattr(d, "x"), r"has no 'x'"),
    (lambda d: setattr(d, "edge_index", d.edge_index.clone().fill_(30)),
     r"edge_index of file g.pt holds node ids outside \[0, 30\)"),
    (lambda d: setattr(d, "edge_index", d.edge_index.clone().fill_(-1)), r"outside \[0, 30\)"),
    (lambda d: setattr(d, "edge_index", d.edge_index.float()), r"integer \[2, num_edges\]"),
    (lambda d: setattr(d, "y", torch.rand(30)), "one integer class id per node"),
    (lambda d: setattr(d, "y", torch.zeros(30, 2, dtype=torch.long)), "multi-label"),
    (lambda d: setattr(d, "y", torch.zeros(30, dtype=torch.long)), "single class"),
    (lambda d: setattr(d, "y", torch.full((30,), -1)), "no labelled node"),
    (lambda d: setattr(d, "x", torch.randn(30, 2, 2)), r"x of file g.pt must be"),
])
def test_bad_graph_is_a_config_error_naming_the_key(change, match):
    d = _graph()
    change(d)
    with pytest.raises(ConfigError, match=match) as ei:
        _bundle(d)
    assert str(ei.value).startswith("data.path: ") and "\n" not in str(ei.value)


def test_bad_masks_and_objects():
    m = torch.zeros(30, dtype=torch.bool)
    m[:5] = True
    d = _graph(train_mask=m, val_mask=m.clone(), test_mask=torch.zeros(30, dtype=torch.bool))
    with pytest.raises(ConfigError, match="test_mask of file g.pt is empty"):
        _bundle(d)
    d = _graph(train_mask=m.long(), val_mask=m, test_mask=m)
    with pytest.raises(ConfigError, match="train_mask of file g.pt must be a boolean"):
        _bundle(d)
    with pytest.raises(ConfigError, match="holds a list"):
        _bundle([1, 2])
