"""Projections in the kernels' padded head width (pyg_dfgnn/nn/_padded.py).

On CUDA, head widths that are not a multiple of the vector (8 x 10, 8 x 19)
are produced padded by the layers, so the op copies nothing.  The padded path
is forced here on CPU (``kernel_width`` patched) and compared in float64 with
PyG's own layer: output and every gradient, for the options that touch the
epilogue (concat, mean, root weight, beta, residual, bias, edge features)."""
import pytest
import torch
import torch_geometric.nn as pygnn

import pyg_dfgnn.nn as dnn
from pyg_dfgnn.nn import _padded, gat_conv, gatv2_conv, transformer_conv
from pyg_dfgnn.schedule import padded_width

from ._equiv import assert_same_grads

CASES = [
    ("TransformerConv", dict(out_channels=10, heads=8)),
    ("TransformerConv", dict(out_channels=19, heads=2, concat=False, beta=True, edge_dim=3)),
    ("TransformerConv", dict(out_channels=10, heads=3, root_weight=False)),
    ("GATv2Conv", dict(out_channels=10, heads=8)),
    ("GATv2Conv", dict(out_channels=19, heads=2, edge_dim=3, share_weights=True)),
    ("GATv2Conv", dict(out_channels=19, heads=2, concat=False, residual=True)),
    ("GATv2Conv", dict(out_channels=10, heads=2, bias=False)),
    ("GATConv", dict(out_channels=10, heads=8)),
    ("GATConv", dict(out_channels=19, heads=2, edge_dim=3, concat=False)),
    ("GATConv", dict(out_channels=10, heads=2, residual=True, bias=False)),
]


@pytest.fixture
def force_padding(monkeypatch):
    calls = []

    def width(chans, x, heads=1, kind=-1, pad_small=False):
        calls.append(chans)
        return padded_width(chans, torch.float32)
    for mod in (transformer_conv, gatv2_conv, gat_conv):
        monkeypatch.setattr(mod, "kernel_width", width)
    return calls


@pytest.mark.parametrize("cls,kw", CASES)
def test_padded_projection_matches_pyg_in_float64(cls, kw, force_padding):
    torch.manual_seed(0)
    ei = torch.randint(0, 50, (2, 300))
    kw = dict(in_channels=16, **kw)
    ref = getattr(pygnn, cls)(**kw).double()
    ours = getattr(dnn, cls)(**kw).double()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(50, 16, dtype=torch.float64, requires_grad=True)
    args = (x, ei) + ((torch.randn(300, 3, dtype=torch.float64),) if kw.get("edge_dim") else ())
    a, b = ref(*args), ours(*args)
    assert force_padding, "the padded path was not taken"
    torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12)
    assert_same_grads(ref, ours, x, a, b, torch.randn_like(a), rtol=1e-10, atol=1e-12)


def test_padded_linear_layout():
    lin = torch.nn.Linear(6, 2 * 3)
    x = torch.randn(4, 6)
    y = _padded.padded_linear(lin, x, 2, 3, 4)
    assert y.shape == (4, 2, 4)
    assert torch.equal(y[..., 3], torch.zeros(4, 2))
    torch.testing.assert_close(y[..., :3], lin(x).view(4, 2, 3))
    assert _padded.kernel_width(10, x) == 10          # CPU: nothing padded


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("chans,dtype,kind,small,large", [
    (10, torch.float32, 2, 10, 10),     # the kernels run 10 fp32 as it is (float2)
    (10, torch.float32, 1, 10, 10),
    (10, torch.float32, 0, 10, 10),
    (9, torch.float32, 2, 10, 10),      # the op would pad 9 to 10 anyway
    (19, torch.float32, 0, 20, 20),     # the op would pad 19 anyway
    (10, torch.bfloat16, 2, 12, 10),    # dot / AGNN: 12 on small calls, 10 on
    (6, torch.float16, 3, 8, 6),        # GPU-bound ones (five 4-byte chunks)
    (10, torch.bfloat16, 1, 12, 12),    # GATv2 pads bf16 10 to 12
    (10, torch.bfloat16, 0, 10, 10),    # GAT runs it as it is (4-byte vectors)
    (10, torch.float16, 0, 10, 10),
    (19, torch.bfloat16, 0, 20, 20),
    (64, torch.bfloat16, 2, 64, 64),
])
def test_kernel_width_on_cuda(chans, dtype, kind, small, large):
    """Small (host-bound) CUDA calls project to the width the op would pad to
    anyway where asked (``pad_small``: the Transformer), so the op copies
    nothing (the 8-byte padded width for dot attention's and AGNN's half
    heads of 2 mod 4, which the op would take as they are), else to
    ``chans``; GPU-bound ones to the width the kernels take as it is (fp32;
    GAT's half precision; those half heads of 2 mod 4), else to the 16-byte
    padded width."""
    x = torch.empty(100, 8, device="cuda", dtype=dtype)
    assert _padded.kernel_width(chans, x, 8, kind, pad_small=True) == small
    assert _padded.kernel_width(chans, x, 8, kind) == chans
    xl = torch.empty(200_000, 8, device="cuda", dtype=dtype)
    assert _padded.kernel_width(chans, xl, 8, kind) == large


def test_gpu_bound_threshold():
    assert not _padded.gpu_bound(2968, 8, 19)          # a PATTERN batch of 26 graphs
    assert _padded.gpu_bound(100_000, 8, 10)           # a 100k-node graph
