"""Random problems shared by the CPU and CUDA op tests."""
import torch

from pyg_dfgnn.graph import get_graph
from pyg_dfgnn.ops import DOT, GAT, GATV2



class _Kind(int):
    """An op kind (equal to the plain constant) with test options: ``bias``
    gives GAT an output bias ``[H, F]``, ``key_scale`` dot attention a key
    scale ``[N_src, H]`` (keys ``c_j k_j``, no edge features); the op takes
    either as its ``att``."""

    bias = False
    key_scale = False


def _with(kind: int, option: str) -> _Kind:
    k = _Kind(kind)
    setattr(k, option, True)
    return k


#: the kinds the op tests run; "gat_bias" is GAT with the layer's bias folded
#: into the kernel's epilogue, "dot_kscale" dot attention with a key scale
KINDS = {"gat": GAT, "gat_bias": _with(GAT, "bias"), "gatv2": GATV2, "dot": DOT,
         "dot_kscale": _with(DOT, "key_scale")}


def random_graph(num_src, num_dst, num_edges, device="cpu", self_loops=True, dups=True,
                 super_node=None, generator=None):
    src = torch.randint(0, num_src, (num_edges,), generator=generator)
    dst = torch.randint(0, num_dst, (num_edges,), generator=generator)
    if num_dst > 3:
        dst = torch.where(dst == num_dst - 1, dst - 1, dst)   # an isolated destination
    parts_s, parts_d = [src], [dst]
    if dups and num_edges > 4:
        parts_s.append(src[:4])
        parts_d.append(dst[:4])
    if self_loops:
        n = min(num_src, num_dst)
        loops = torch.arange(0, n, 3)
        parts_s.append(loops)
        parts_d.append(loops)
    if super_node is not None:
        deg, node = super_node
        parts_s.append(torch.randint(0, num_src, (deg,), generator=generator))
        parts_d.append(torch.full((deg,), node))
    ei = torch.stack([torch.cat(parts_s), torch.cat(parts_d)]).to(device)
    return ei


def make_inputs(kind, num_src, num_dst, num_edges, heads, feat, dtype, device, edge=False,
                generator=None):
    def r(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64).to(device, dtype)
    if kind == GAT:   # (att: the optional output bias)
        return dict(dst=r(num_dst, heads), src=r(num_src, heads), val=r(num_src, heads, feat),
                    edge=r(num_edges, heads) if edge else None,
                    att=r(heads, feat) if getattr(kind, "bias", False) else None)
    if kind == GATV2:
        return dict(dst=r(num_dst, heads, feat), src=r(num_src, heads, feat), val=None,
                    edge=r(num_edges, heads, feat) if edge else None, att=r(heads, feat))
    if getattr(kind, "key_scale", False):   # positive, as AGNN's 1 / |x|
        return dict(dst=r(num_dst, heads, feat), src=r(num_src, heads, feat),
                    val=r(num_src, heads, feat), edge=None,
                    att=(r(num_src, heads).abs() + 0.25).to(dtype))
    return dict(dst=r(num_dst, heads, feat), src=r(num_src, heads, feat),
                val=r(num_src, heads, feat), edge=r(num_edges, heads, feat) if edge else None,
                att=None)


def graph_case(kind, num_src, num_dst, num_edges, heads, feat, dtype=torch.float64,
               edge=False, device="cpu", generator=None):
    """A case: a random graph (drawn with ``generator``), its
    :func:`~pyg_dfgnn.graph.get_graph` on ``device`` and inputs of ``kind``
    there that require grad (drawn from the global generator):
    ``(edge_index, graph, inputs)``."""
    from pyg_dfgnn.graph import get_graph
    ei = random_graph(num_src, num_dst, num_edges, generator=generator).to(device)
    g = get_graph(ei, (num_src, num_dst))
    inp = make_inputs(kind, num_src, num_dst, ei.size(1), heads, feat, dtype, device, edge)
    for v in leaves(inp):
        v.requires_grad_(True)
    return ei, g, inp


def call(kind, graph, inp, dropout=0.0, return_alpha=False, scale=None):
    from pyg_dfgnn import ops
    if kind == GAT:
        return ops.gat_attention(graph, inp["val"], inp["src"], inp["dst"], inp["edge"],
                                 0.2, dropout, return_alpha, bias=inp["att"])
    if kind == GATV2:
        return ops.gatv2_attention(graph, inp["src"], inp["dst"], inp["att"], inp["edge"],
                                   0.2, dropout, return_alpha)
    return ops.dot_attention(graph, inp["dst"], inp["src"], inp["val"], inp["edge"], scale,
                             dropout, return_alpha, key_scale=inp["att"])


def op_args(kind, graph, inp, dropout=0.0, seed=None, need_alpha=False, scale=0.5):
    """Positional arguments of ``dfgnn::attention_fwd`` (automatic schedule)."""
    g = graph
    return (int(kind), g.rowptr, g.col, g.perm, g.t_rowptr, g.t_col, g.t_perm, inp["dst"],
            inp["src"], inp["val"], inp["edge"], inp["att"], scale, 0.2, dropout, seed,
            need_alpha, [0, 0, 0], None, None, None, None)


def leaves(inp):
    return [v for v in inp.values() if v is not None]
