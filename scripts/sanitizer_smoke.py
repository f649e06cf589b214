"""Small forward+backward of every kernel path, for compute-sanitizer:

    compute-sanitizer --tool memcheck python scripts/sanitizer_smoke.py
"""
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "ops"))
from _cases import KINDS, call, leaves, make_inputs, random_graph  # noqa: E402

from pyg_dfgnn import schedule  # noqa: E402
from pyg_dfgnn.graph import get_graph  # noqa: E402

#: the schedule overrides each graph runs under (the skewed graphs below make
#: automatic plans order the work items by degree)
PLANS = ((None, None, None), (64, None, None), (None, 1, None), (64, 2, "row"),
         (0, None, "degree"))


def smoke(kind, ei, size, heads, feat, dtype, plans=PLANS, edge=True):
    """Forward (dropout, attention weights) and backward of one kernel kind on
    the graph ``ei`` under each ``(split, group, order)`` of ``plans``."""
    g = get_graph(ei.cuda(), size)
    inp = make_inputs(kind, size[0], size[1], ei.size(1), heads, feat, dtype, "cuda", edge)
    for v in leaves(inp):
        v.requires_grad_(True)
    for split, group, order in plans:
        with schedule.override(split=split, group=group, order=order):
            out, alpha = call(kind, g, inp, dropout=0.3, return_alpha=True)
            torch.autograd.grad(out, leaves(inp), torch.randn_like(out))


torch.manual_seed(0)
for name, kind in KINDS.items():
    for dtype in (torch.float32, torch.bfloat16):
        for feat in (3, 10, 19, 64, 152, 300):   # (152, and 10 / 19 on 8-byte vectors: dot attention's and GATv2's wide tiles)
            ei = random_graph(60, 50, 300, super_node=(400, 2))
            ei = torch.cat([ei, torch.stack([torch.full((300,), 4), torch.randint(0, 50, (300,))])], 1)
            smoke(kind, ei, (60, 50), 2, feat, dtype)
# GAT without edge features: the backward that stores nothing per edge
# (cuda/attention_launch.cuh: bwd_gat_atomic), with split rows and columns
for name in ("gat", "gat_bias"):
    for dtype in (torch.float32, torch.bfloat16):
        for heads, feat in ((2, 3), (8, 10), (8, 19), (4, 64), (1, 300), (32, 4)):
            ei = random_graph(60, 50, 300, super_node=(400, 2))
            ei = torch.cat([ei, torch.stack([torch.full((300,), 4), torch.randint(0, 50, (300,))])], 1)
            smoke(KINDS[name], ei, (60, 50), heads, feat, dtype, edge=False)
# dot / GATv2 at 8 x 10 fp32 on a graph whose gathered rows exceed kL2Bytes
# (cuda/attention_kernels.cuh): the default launch variant; the small graphs
# above take the L2-resident one
for name in ("dot", "gatv2"):
    smoke(KINDS[name], random_graph(60000, 100, 2000, super_node=(400, 2)), (60000, 100), 8, 10,
          torch.float32, plans=PLANS[:1])
# GATv2 on a capped row-pass grid (cuda/attention_launch.cuh: bwd_row_grid):
# 12k destination rows x 5 heads, so every lane group takes several (item,
# head) pairs and the grid is rounded up to whole heads of groups
smoke(KINDS["gatv2"], random_graph(12000, 12000, 30000, super_node=(400, 2)), (12000, 12000), 5,
      16, torch.float32, plans=PLANS[:2])
# GATv2's att-gradient rows with more heads than a block has groups (16 lanes
# per head of 128: 16 groups, 32 heads); and the alpha mode forced where it is
# not the default (PYG_DFGNN_ALPHA_MODE=1: GATv2, and bf16's alpha in bf16),
# stored, without edge features, with split rows and columns
smoke(KINDS["gatv2"], random_graph(200, 200, 1200, super_node=(300, 2)), (200, 200), 32, 128,
      torch.float32, plans=PLANS[:2])
os.environ["PYG_DFGNN_ALPHA_MODE"], os.environ["PYG_DFGNN_BACKWARD"] = "1", "store"
for name in ("dot", "gatv2"):
    for dtype in (torch.float32, torch.bfloat16):
        for feat in (8, 10, 19):
            ei = random_graph(60, 50, 300, super_node=(400, 2))
            smoke(KINDS[name], ei, (60, 50), 2, feat, dtype, edge=False)
del os.environ["PYG_DFGNN_ALPHA_MODE"], os.environ["PYG_DFGNN_BACKWARD"]
# dot attention's and AGNN's fp16 / bf16 heads of 6 and 10 on the five-chunk
# tile of 4-byte vectors (cuda/attention_api.h: half_x5_width) in the
# recomputing backward (the stored one runs in the loops above)
os.environ["PYG_DFGNN_BACKWARD"] = "recompute"
for name in ("dot", "dot_kscale"):
    for dtype in (torch.float16, torch.bfloat16):
        for feat in (6, 10):
            ei = random_graph(60, 50, 300, super_node=(400, 2))
            smoke(KINDS[name], ei, (60, 50), 8, feat, dtype, edge=name == "dot")
del os.environ["PYG_DFGNN_BACKWARD"]
# GAT with the node logits in the op (ops.gat_node_attention): the logits
# kernel and its backward at aligned, unaligned and padded widths
from pyg_dfgnn import ops  # noqa: E402
for dtype in (torch.float32, torch.bfloat16):
    for heads, feat, pad in ((2, 3, 0), (8, 10, 2), (8, 19, 1), (4, 64, 0), (1, 300, 0)):
        ei = random_graph(60, 60, 300, super_node=(400, 2)).cuda()
        g = get_graph(ei, (60, 60))
        x = torch.nn.functional.pad(torch.randn(60, heads, feat), (0, pad)).to("cuda", dtype)
        a_s, a_d = (torch.randn(1, heads, feat, device="cuda") for _ in range(2))
        b = torch.randn(heads, feat, device="cuda", dtype=dtype)
        for v in (x, a_s, a_d, b):
            v.requires_grad_(True)
        out, _ = ops.gat_node_attention(g, x, a_s, a_d, None, 0.2, 0.3, False, b)
        torch.autograd.grad(out, (x, a_s, a_d, b), torch.randn_like(out))
# dot attention on row-strided q / k / v (column blocks of one tensor, as the
# Transformer layer's fused projection GEMM hands them over)
for dtype in (torch.float32, torch.bfloat16):
    for heads, feat in ((8, 12), (2, 64), (8, 10)):
        ei = random_graph(60, 60, 300, super_node=(400, 2)).cuda()
        g = get_graph(ei, (60, 60))
        y = torch.randn(60, 3 * heads * feat + 8, device="cuda", dtype=dtype, requires_grad=True)
        q, k, v = (y[:, i * heads * feat:(i + 1) * heads * feat].view(60, heads, feat)
                   for i in range(3))
        # the residual added in the epilogue (dfgnn_C::attention_fwd_residual): a
        # column block read as it is (full and sliced width) and an unaligned copy
        r = torch.randn(60, 4 * heads * feat, device="cuda", dtype=dtype)
        r = r[:, 3 * heads * feat:].view(60, heads, feat)
        ru = torch.randn(60 * heads * feat + 1, device="cuda", dtype=dtype)[1:]
        for split in (None, 64):
            with schedule.override(split=split):
                out, _ = ops.dot_attention(g, q, k, v, None, None, 0.3)
                torch.autograd.grad(out, (y,), torch.randn_like(out))
                with torch.no_grad():
                    for res in (r, r[..., :feat - 1], ru.view(60, heads, feat)):
                        ops.dot_attention(g, q, k, v, None, None, 0.3, residual=res)
# AGNN (ops.agnn_attention): keys that are the values (one gather per edge)
# and the key scale, at aligned, unaligned and wide (> one tile) widths; 152,
# 192 and 256 run the wide tiles (16 lanes; forced 8 lanes: several columns)
for dtype in (torch.float32, torch.bfloat16, torch.float16):
    for feat in (7, 80, 152, 192, 256, 300):
        ei = random_graph(60, 60, 300, super_node=(400, 2)).cuda()
        g = get_graph(ei, (60, 60))
        x = torch.randn(60, feat, device="cuda", dtype=dtype, requires_grad=True)
        beta = torch.ones(1, device="cuda", dtype=dtype, requires_grad=True)
        for split, group in ((None, None), (64, None), (64, 8)):
            with schedule.override(split=split, group=group):
                out, _ = ops.agnn_attention(g, x, beta, 0.3, True)
                torch.autograd.grad(out, (x, beta), torch.randn_like(out))
        with torch.no_grad():   # (the prologue kernel: dfgnn_C::agnn_prologue)
            ops.agnn_attention(g, x, beta, 0.3, True)
# merges of many partial slots (a row of 9,000 edges and a column of 3,000 in
# segments of 8: 1,125 and 375 slots, more than a merge block's 128 threads;
# 300 features: several passes / several per thread)
hub_ei = torch.cat([random_graph(200, 200, 1000, super_node=(9000, 5)),
                    torch.stack([torch.full((3000,), 7), torch.randint(0, 200, (3000,))])], 1)
for name, kind in KINDS.items():
    for dtype, feat in ((torch.float32, 1), (torch.float32, 300), (torch.bfloat16, 10)):
        smoke(kind, hub_ei, (200, 200), 2, feat, dtype, plans=((8, None, None),))
torch.cuda.synchronize()
print("sanitizer smoke: all kernel paths ran")
# the padded projection weights in one kernel (cuda/pad_heads.cu): 1-8 maps,
# every element size, with and without biases, inside the Transformer layer
from pyg_dfgnn.ops.fused import _ext  # noqa: E402
for dtype in (torch.float32, torch.bfloat16, torch.float64):
    for n, heads, chans, width, fin in ((1, 8, 10, 12, 64), (4, 8, 19, 20, 7), (8, 2, 3, 8, 1)):
        ws = [torch.randn(heads * chans, fin, device="cuda", dtype=dtype) for _ in range(n)]
        bs = [torch.randn(heads * chans, device="cuda", dtype=dtype) for _ in range(n)]
        _ext().stack_pad_heads(ws, bs, heads, chans, width)
        _ext().stack_pad_heads(ws, [], heads, chans, width)
from pyg_dfgnn.nn import TransformerConv, _padded  # noqa: E402
_padded.GPU_BOUND_ELEMENTS = 0
conv = TransformerConv(16, 10, heads=8).cuda()
xg = torch.randn(60, 16, device="cuda", requires_grad=True)
ei = random_graph(60, 60, 300, super_node=(400, 2)).cuda()
with torch.no_grad():
    conv(xg, ei)
conv(xg, ei).sum().backward()
# AGNN's prologue backward kernel (ops._AGNNPrologue on CUDA): every dtype, a
# subset of destination rows, absent gradients, a row below eps
for dtype in (torch.float32, torch.bfloat16, torch.float16):
    for n, f, nd in ((129, 152, 100), (40, 19, 40)):
        xa = torch.randn(n, f, device="cuda", dtype=dtype)
        xa[2] = 0
        xa.requires_grad_(True)
        ba = torch.tensor(0.7, device="cuda", dtype=dtype, requires_grad=True)
        q, c, k = ops._AGNNPrologue.apply(xa, ba, nd, 1e-3)
        (q.float().sum() + c.float().sum() + k.float().square().sum()).backward()
        q, c, k = ops._AGNNPrologue.apply(xa, ba, nd, 1e-3)
        c.float().sum().backward()
# the one-op layer paths (dfgnn_C::gat_layer, gatv2_layer, transformer_layer;
# the layers' _layer_op): every dtype, widths the kernels take as
# they are and ones padded, with and without a (skip) bias, dropout, a super
# node, without autograd and in inference mode, below and above the GPU-bound
# size (the latter: padded projections, GEMV bias gradients)
from pyg_dfgnn.nn import GATConv, GATv2Conv  # noqa: E402
ei = random_graph(60, 60, 300, super_node=(400, 2)).cuda()
for cls in (GATConv, GATv2Conv, TransformerConv):
    for bound in (1 << 22, 0):
        _padded.GPU_BOUND_ELEMENTS = bound
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            for heads, chans, bias in ((8, 10, True), (8, 19, True), (4, 64, False),
                                       (1, 300, True), (32, 4, True)):
                conv = cls(16, chans, heads=heads, bias=bias, dropout=0.3).to("cuda", dtype)
                xg = torch.randn(60, 16, device="cuda", dtype=dtype, requires_grad=True)
                conv(xg, ei).backward(torch.randn(60, heads * chans, device="cuda",
                                                  dtype=dtype))
                with torch.no_grad():
                    conv(xg, ei)
                with torch.inference_mode():
                    conv.eval()(xg.detach(), ei)
# (and the layers' paths of several ops, which calls that need them take)
from pyg_dfgnn.nn import gat_conv, gatv2_conv, transformer_conv  # noqa: E402
for mod, cls in ((gat_conv, GATConv), (gatv2_conv, GATv2Conv),
                 (transformer_conv, TransformerConv)):
    mod.LAYER_OP[0] = False
    for heads, chans in ((8, 10), (8, 19)):
        conv = cls(16, chans, heads=heads, dropout=0.3).cuda()
        xg = torch.randn(60, 16, device="cuda", requires_grad=True)
        conv(xg, ei).sum().backward()
    mod.LAYER_OP[0] = True
# AGNN's one-op path (dfgnn_C::agnn_layer): every dtype, narrow / wide / odd
# widths, learned and fixed beta, a zero row, inference mode
from pyg_dfgnn.nn import AGNNConv  # noqa: E402
for dtype in (torch.float32, torch.bfloat16, torch.float16):
    for feat in (7, 80, 152, 300):
        for learn in (True, False):
            conv = AGNNConv(requires_grad=learn).to("cuda", dtype)
            xa = torch.randn(60, feat, device="cuda", dtype=dtype)
            xa[3] = 0
            xa.requires_grad_(True)
            conv(xa, ei).backward(torch.randn(60, feat, device="cuda", dtype=dtype))
            with torch.inference_mode():
                conv(xa.detach(), ei)
# the Transformer's and GATv2's layer ops, whose backward writes the source-side
# gradients over their own saved projections (cuda/dfgnn_ops.cpp: src_in_place),
# in both column-pass modes, with split rows / columns, on GPU-bound calls (the
# layers project into the kernels' width) and a head over two feature tiles
# (1 x 512: the recomputing pass writes to a buffer of its own)
_padded.GPU_BOUND_ELEMENTS = 0
for mode in ("store", "recompute"):
    with ops.backward_mode(mode):
        for cls in (TransformerConv, GATv2Conv):
            for dtype in (torch.float32, torch.bfloat16):
                for heads, ch in ((8, 10), (8, 19), (1, 512)):
                    ei = random_graph(60, 60, 300, super_node=(400, 2)).cuda()
                    conv = cls(16, ch, heads=heads).to("cuda", dtype)
                    x = torch.randn(60, 16, device="cuda", dtype=dtype, requires_grad=True)
                    for split in (None, 64):
                        with schedule.override(split=split):
                            out = conv(x, ei)
                            out.backward(torch.randn_like(out))
_padded.GPU_BOUND_ELEMENTS = 1 << 22
torch.cuda.synchronize()
print("sanitizer smoke: done")
