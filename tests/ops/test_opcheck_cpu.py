"""torch.library.opcheck of the custom ops on CPU (fake impl, autograd registration)."""
import pytest
import torch

from pyg_dfgnn.graph import get_graph
from pyg_dfgnn.ops import fused
from _cases import KINDS, leaves, make_inputs, random_graph


@pytest.mark.parametrize("kind", list(KINDS))
def test_opcheck_forward(kind):
    k = KINDS[kind]
    ei = random_graph(12, 10, 40)
    g = get_graph(ei, (12, 10))
    inp = make_inputs(k, 12, 10, ei.size(1), 2, 4, torch.float32, "cpu", True)
    for v in leaves(inp):
        v.requires_grad_(True)
    args = (k, g.rowptr, g.col, g.perm, g.t_rowptr, g.t_col, g.t_perm, inp["dst"], inp["src"],
            inp["val"], inp["edge"], inp["att"], 0.5, 0.2, 0.0, None, False, [0, 0, 0], None,
            None, None, None)
    torch.library.opcheck(fused.attention_fwd, args)
