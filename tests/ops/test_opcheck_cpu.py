"""torch.library.opcheck of the custom ops on CPU (fake impl, autograd registration)."""
import pytest
import torch

from pyg_dfgnn.graph import get_graph
from pyg_dfgnn.ops import fused
from _cases import KINDS, leaves, make_inputs, op_args, random_graph


@pytest.mark.parametrize("kind", list(KINDS))
def test_opcheck_forward(kind):
    k = KINDS[kind]
    ei = random_graph(12, 10, 40)
    g = get_graph(ei, (12, 10))
    inp = make_inputs(k, 12, 10, ei.size(1), 2, 4, torch.float32, "cpu", True)
    for v in leaves(inp):
        v.requires_grad_(True)
    args = op_args(k, g, inp)
    torch.library.opcheck(fused.attention_fwd, args)
