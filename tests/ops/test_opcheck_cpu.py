"""torch.library.opcheck of the custom ops on CPU (fake impl, autograd registration)."""
import pytest
import torch

from pyg_dfgnn.graph import get_graph
from pyg_dfgnn.ops import fused
from _cases import KINDS, graph_case, leaves, make_inputs, op_args, random_graph


@pytest.mark.parametrize("kind", list(KINDS))
def test_opcheck_forward(kind):
    k = KINDS[kind]
    _, g, inp = graph_case(k, 12, 10, 40, 2, 4, torch.float32, edge=True)
    args = op_args(k, g, inp)
    torch.library.opcheck(fused.attention_fwd, args)


@pytest.mark.parametrize("loops", [-1, 12])
@pytest.mark.parametrize("kind", list(KINDS))
def test_opcheck_graph_attention(kind, loops):
    """The op on an edge_index (what compiled layers call): fake impl, autograd
    and the dynamic-shape AOT trace; its output equals the CSR op's."""
    k = KINDS[kind]
    ei = random_graph(12, 10, 40) if loops < 0 else random_graph(12, 12, 40)
    nd = 10 if loops < 0 else 12
    g = get_graph(ei, (12, nd), None if loops < 0 else loops)
    inp = make_inputs(k, 12, nd, ei.size(1), 2, 4, torch.float64, "cpu",
                      edge=loops < 0)   # (edge features follow edge_index's order)
    for v in leaves(inp):
        v.requires_grad_(True)
    args = (int(k), ei, 12, nd, loops, inp["dst"], inp["src"], inp["val"], inp["edge"],
            inp["att"], 0.5, 0.2, 0.0, None)
    torch.library.opcheck(fused.graph_attention_fwd, args)
    out, lse = fused.graph_attention_fwd(*args)
    ref = fused.attention_fwd(*op_args(k, g, inp))
    torch.testing.assert_close(out, ref[0], rtol=0, atol=0)
    torch.testing.assert_close(lse, ref[1], rtol=0, atol=0)


@pytest.mark.skipif(not hasattr(torch.Tag, "cudagraph_unsafe"), reason="torch without the tag")
def test_graph_attention_is_not_cuda_graph_captured():
    """The ops on an edge_index look the graph up in Python when they run: a
    CUDA-graph replay would reuse the captured batch's CSR, so Inductor must
    not capture them (compile mode reduce-overhead)."""
    for op in (torch.ops.dfgnn.graph_attention_fwd, torch.ops.dfgnn.graph_attention_bwd):
        assert torch.Tag.cudagraph_unsafe in op.default.tags
