from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"

# a tiny PATTERN run: 16/8/8 generated graphs, a 2-layer GAT of width 16
TINY = ["data.num_train=16", "data.num_val=8", "data.num_test=8", "batch_size=8",
        "model.hidden=16", "model.heads=2", "model.layers=2", "log.progress=false"]


def torchrun_train(args, timeout: float = 120, **env):
    """``torchrun --standalone --nproc-per-node=2 -m pyg_dfgnn train ARGS`` from
    the repository root (``OMP_NUM_THREADS=1`` and ``env`` added to the
    environment), its completed process; a non-zero exit fails the test with
    the tails of both streams in full (an assertion's repr would cut them to a
    line, which hid the cause of a rank's abort)."""
    import os
    import subprocess
    import sys
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node=2", "-m", "pyg_dfgnn", "train"] + [str(a) for a in args]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO,
                       env=dict(os.environ, OMP_NUM_THREADS="1", **env), timeout=timeout)
    if p.returncode != 0:
        pytest.fail(f"torchrun exited with {p.returncode}\n--- stdout (tail)\n"
                    f"{p.stdout[-4000:]}\n--- stderr (tail)\n{p.stderr[-6000:]}",
                    pytrace=False)
    return p


def fused_available() -> bool:
    try:
        from pyg_dfgnn.nn import AGNNConv, GATConv, TransformerConv  # noqa: F401
        return True
    except Exception:
        return False


@pytest.fixture
def tiny_args(tmp_path):
    """CLI arguments for a tiny quick-config run writing under tmp_path."""
    def make(*extra, out="run"):
        return ([str(CONFIGS / "pattern_gat_quick.yaml")] + TINY
                + [f"data.root={tmp_path / 'data'}", f"out_dir={tmp_path / out}"] + list(extra))
    return make


@pytest.fixture
def fused_dtypes(monkeypatch):
    """The dtypes of the source features of every fused attention call
    (``pyg_dfgnn.ops.fused.attention_on``) made while the test runs."""
    import pyg_dfgnn.ops.fused as fused
    seen = []
    orig = fused.attention_on

    def spy(kind, *args):
        seen.append(args[3].dtype)  # src_feat (after graph, plan, dst_feat)
        return orig(kind, *args)
    monkeypatch.setattr(fused, "attention_on", spy)
    return seen


def saved_bytes(model, *args, **kwargs) -> int:
    """Bytes of the distinct storages autograd saves for backward in one
    ``model(*args, **kwargs)``."""
    import torch
    seen = {}

    def pack(t):
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(*args, **kwargs)
    return sum(seen.values())
