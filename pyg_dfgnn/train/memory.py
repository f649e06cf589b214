"""Peak-memory estimate of a ``dfgnn train`` step, from the graph and model sizes.

Used by ``dfgnn train --dry-run`` (print the estimate, train nothing) and at
the start of every run (log it; refuse, exit 2, a run that cannot fit the
device's free memory; ``memory_check=false`` skips the refusal).

The model of one training step (``b`` bytes per element, fp32 = 4; ``N``
nodes and ``E`` edges per step -- the whole graph, or the sampled subgraph's
upper bound ``B (1 + f1 + f1 f2 + ...)`` nodes with ``data.loader=neighbor``;
``E' = E + N`` where the layer adds self-loops; ``D = heads x per-head`` width;
``H`` heads):

* weights: parameters, gradients and two Adam moments, ``4 P b``;
* inputs: features ``N F0 b`` and ``edge_index`` ``16 E``;
* fused layers: a destination-major CSR and its transpose (``int32`` indices
  below 2**31: ``2 (N + 1) + 4 E'`` indices), shared by the layers; per layer
  ``O(N D)`` saved activations (projection, output, logsumexp, norm / ELU
  outputs): ``N (k_node D + 3 H) b``, and no ``[E, H, F]`` tensor; plus
  ``3 N hidden b`` for the input encoder and the readout;
* pyg layers: per layer the same node activations plus the ``O(E H F)``
  messages PyG materialises and keeps for backward (gathered features, attention
  logits / softmax / dropout masks, the looped ``edge_index``):
  ``E' (k_msg D + k_edge H) b + 16 E'``, and a transient ``2 E' D b`` (the
  message and its gradient) on top of the saved ones at the peak.

The constants are per model (:data:`LAYER_CONSTANTS`); the formula is checked
on CPU against the bytes autograd actually saves
(tests/train/test_sampled_memory.py).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

import torch

__all__ = ["MemoryEstimate", "estimate_memory", "estimate_for_config",
           "device_sampling_bytes", "samples_on_device", "device_free_bytes",
           "check_fits", "LAYER_CONSTANTS", "format_bytes", "set_cublas_workspace",
           "cublas_workspace_for", "AUTO_CUBLAS_WORKSPACE_KIB"]

#: per model: (k_node: [N, D] tensors saved per layer, k_msg: [E', D] tensors
#: saved per pyg layer, k_edge: [E', H] tensors saved per pyg layer, self-loops)
LAYER_CONSTANTS = {
    "gat": (4, 1, 5, True),
    "gt": (10, 3, 3, False),
    "agnn": (6, 2, 3, True),
}

#: k_node of the fused layers where it differs: GAT's bias is added in the
#: kernel's epilogue (pyg_dfgnn.nn.GATConv), so its output is the op's own
#: saved output, one [N, D] tensor fewer (under autocast the bias is added
#: outside and the estimate is one [N, D] tensor low per layer); AGNN's op
#: takes x as keys and values with a per-node key scale (ops.agnn_attention), so
#: it keeps x, q and its output but no x_norm (measured: ~2.5 [N, D] tensors
#: per layer, tests/train/test_sampled_memory.py)
FUSED_K_NODE = {"gat": 3, "agnn": 3}


def format_bytes(n: float) -> str:
    return f"{n / 2 ** 30:.2f} GiB" if n >= 2 ** 28 else f"{n / 2 ** 20:.1f} MiB"


@dataclass
class MemoryEstimate:
    backend: str
    num_nodes: int            # per step
    num_edges: int            # per step
    parts: Dict[str, float] = field(default_factory=dict)

    @property
    def activations(self) -> float:
        return self.parts.get("activations", 0.0) + self.parts.get("transient", 0.0)

    @property
    def total(self) -> float:
        return float(sum(self.parts.values()))

    def describe(self) -> str:
        parts = ", ".join(f"{k} {format_bytes(v)}" for k, v in self.parts.items())
        return (f"memory estimate (backend={self.backend}, {self.num_nodes:,} nodes / "
                f"{self.num_edges:,} edges per step): peak ~{format_bytes(self.total)} "
                f"({parts})")


def _layer_widths(mcfg, num_classes: int):
    """(D, H) of every attention layer of ``build_model(mcfg, ...)``."""
    m = mcfg
    if m.name == "agnn":
        return [(m.hidden, 1)] * m.layers
    if m.name == "gt":
        return [(m.hidden, m.heads)] * (m.layers - 1) + [(m.out_dim or m.hidden, m.heads)]
    if m.readout == "conv":
        per = m.hidden // m.heads
        return ([(per * m.heads, m.heads)] * (m.layers - 1)
                + [(num_classes * m.out_heads, m.out_heads)])
    return [(m.hidden, m.heads)] * (m.layers - 1) + [(m.out_dim or m.hidden, 1)]


def estimate_memory(mcfg, backend: str, num_nodes: int, num_edges: int, in_dim: int,
                    num_classes: int, num_params: int, elem_bytes: int = 4,
                    categorical: bool = False) -> MemoryEstimate:
    """Peak bytes of one training step (forward + backward + optimizer step)."""
    if backend not in ("fused", "pyg"):
        raise ValueError(f"'backend' must be 'fused' or 'pyg', got {backend!r}")
    if num_nodes < 0 or num_edges < 0:
        raise ValueError(f"'num_nodes' and 'num_edges' must be >= 0, got {num_nodes}, "
                         f"{num_edges}")
    b = int(elem_bytes)
    N, E = int(num_nodes), int(num_edges)
    k_node, k_msg, k_edge, loops = LAYER_CONSTANTS[mcfg.name]
    if backend == "fused":
        k_node = FUSED_K_NODE.get(mcfg.name, k_node)
    loops = loops and getattr(mcfg, "self_loops", True)
    Ep = E + N if loops else E
    widths = _layer_widths(mcfg, num_classes)
    parts: Dict[str, float] = {}
    parts["weights"] = 4.0 * num_params * b
    parts["inputs"] = (N * (8 if categorical else in_dim * b) + 16.0 * E)
    idx = 4 if max(Ep, N + 1) <= 2 ** 31 - 1 else 8
    act, transient = 0.0, 0.0
    if not (mcfg.name == "gat" and mcfg.readout == "conv"):
        # input encoder + readout (MLP: d -> d/2 -> d/4) outside the attention layers
        act += N * 3 * mcfg.hidden * b
    for D, H in widths:
        act += N * (k_node * D + 3 * H) * b
        if backend == "pyg":
            act += Ep * (k_msg * D + k_edge * H) * b + 16.0 * Ep
            transient = max(transient, 2.0 * Ep * D * b)
        else:
            transient = max(transient, 2.0 * N * D * b)
    if backend == "fused":
        parts["graph (CSR + transpose)"] = float((2 * (N + 1) + 4 * Ep) * idx)
    parts["activations"] = act
    parts["transient"] = transient
    return MemoryEstimate(backend, N, E, parts)


def device_sampling_bytes(num_nodes: int, num_edges: int, in_dim: int,
                          categorical: bool = False) -> int:
    """Bytes the device sampler (``data.sample_on: cuda``) keeps on the device
    for a graph of these sizes: the CSC (``colptr``, an ``[N + 1]`` id buffer,
    ``row``, the edge permutation; int64), the features, int64 labels and the
    three split masks (sampling.py: ``DeviceNeighborSampler.graph_bytes`` of
    the loaded graph)."""
    from .sampling import DeviceNeighborSampler
    N = int(num_nodes)
    return DeviceNeighborSampler.index_bytes(N, int(num_edges)) \
        + N * (8 if categorical else 4 * int(in_dim)) + 8 * N + 3 * N


def samples_on_device(cfg, device: Optional[torch.device], nbytes: int) -> bool:
    """Whether a ``data.loader=neighbor`` run keeps the graph on ``device`` for
    sampling: ``data.sample_on`` = ``cuda``, or ``auto`` on CUDA when the graph
    takes at most ``SampledNodeTraining.AUTO_FRACTION`` of the free memory
    (the rule the run applies)."""
    mode = getattr(cfg.data, "sample_on", "cpu")
    if cfg.data.loader != "neighbor" or mode == "cpu" or device is None \
            or device.type != "cuda":
        return False
    if mode == "cuda":
        return True
    from .sampling import SampledNodeTraining
    return SampledNodeTraining.auto_fits(nbytes, device_free_bytes(device)[0])


def estimate_for_config(cfg, in_dim: int, num_classes: int, num_params: int,
                        num_nodes: int, num_edges: int, categorical: bool = False,
                        elem_bytes: int = 4,
                        device: Optional[torch.device] = None) -> MemoryEstimate:
    """The estimate of one step of the run ``cfg`` on a graph of ``num_nodes`` /
    ``num_edges`` (the sampled subgraph's bound with ``data.loader=neighbor``,
    plus the whole graph when it is sampled on ``device``)."""
    held = 0
    if cfg.data.loader == "neighbor":
        from .sampling import expected_subgraph_size
        nbytes = device_sampling_bytes(num_nodes, num_edges, in_dim, categorical)
        held = nbytes if samples_on_device(cfg, device, nbytes) else 0
        s = expected_subgraph_size(cfg.batch_size, cfg.data.num_neighbors, num_nodes,
                                   num_edges)
        num_nodes, num_edges = s["nodes"], s["edges"]
    est = estimate_memory(cfg.model, cfg.backend, num_nodes, num_edges, in_dim, num_classes,
                          num_params, elem_bytes=elem_bytes, categorical=categorical)
    if held:
        est.parts["graph held for device sampling"] = float(held)
    return est


def device_free_bytes(device: torch.device) -> Tuple[Optional[int], str]:
    """(free bytes, description) of ``device``; ``None`` when unknown."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return int(free), (f"{torch.cuda.get_device_name(device)}: {format_bytes(free)} free of "
                           f"{format_bytes(total)}")
    try:
        with open("/proc/meminfo") as f:
            info = {ln.split(":")[0]: int(ln.split()[1]) * 1024 for ln in f if ":" in ln}
        free = info.get("MemAvailable")
        if free is not None:
            return free, f"host RAM: {format_bytes(free)} available"
    except (OSError, ValueError, IndexError):
        pass
    try:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return int(free), f"host RAM: {format_bytes(free)} available"
    except (ValueError, OSError, AttributeError):
        return None, "free memory unknown"


def check_fits(est: MemoryEstimate, device: torch.device) -> Tuple[bool, str]:
    """(fits, message naming the numbers)."""
    free, what = device_free_bytes(device)
    if free is None:
        return True, f"{est.describe()}; {what}"
    fits = est.total <= free
    msg = (f"{est.describe()}; device {device} ({what})")
    if not fits:
        other = "pyg" if est.backend == "fused" else "fused"
        msg = (f"the run would not fit in memory: estimated peak {format_bytes(est.total)} > "
               f"{format_bytes(free)} free on {device} ({what}); {est.describe()}. Lower "
               f"batch_size / data.num_neighbors / model.hidden"
               + (f", try backend={other}" if est.backend == "pyg" else "")
               + ", or set memory_check=false to run anyway")
    return fits, msg


def dry_run(cfg, log=print) -> Dict[str, Any]:
    """``dfgnn train --dry-run``: sizes, estimate and the fit check, no training.

    The synthetic graphs are not generated (their sizes are in the config);
    other data sets are loaded.  Returns ``{"estimate": ..., "fits": ...}``.
    """
    from ..data.datasets import load_data
    from .distributed import resolve_device
    from .models import build_model, count_parameters
    d = cfg.data
    if d.name in ("synthetic_uniform", "synthetic_powerlaw"):
        in_dim, num_classes, categorical = d.num_features, d.num_classes, False
        N, E = int(d.num_nodes), int(d.num_edges)
    else:
        b = load_data(d, seed=cfg.seed, log=lambda m: None)
        in_dim, num_classes, categorical = b.in_dim, b.num_classes, b.categorical
        if b.kind == "graphs":  # one mini-batch of batch_size graphs: the largest ones
            sizes = sorted(((int(g.num_nodes), int(g.num_edges)) for g in b.train),
                           reverse=True)[:cfg.batch_size]
            N, E = sum(s[0] for s in sizes), sum(s[1] for s in sizes)
        else:
            N, E = int(b.data.num_nodes), int(b.data.num_edges)
    model = build_model(cfg.model, in_dim, num_classes, categorical, cfg.backend)
    P = count_parameters(model)
    device = resolve_device(cfg.device)
    est = estimate_for_config(cfg, in_dim, num_classes, P, N, E, categorical, device=device)
    fits, msg = check_fits(est, device)
    log(f"dry run: {cfg.name}: graph {N:,} nodes / {E:,} edges, model {cfg.model.name} "
        f"{P:,} parameters, backend {cfg.backend}")
    if fits:
        log(msg)
    return {"estimate": est, "fits": fits, "message": msg}


#: ``cublas_workspace_kib: auto``: the cuBLAS workspace of runs whose steps
#: replay CUDA graphs.  Measured on an H100 (docs/BENCHMARKS.md, session 21):
#: CLUSTER GT bf16 run peak 184 -> 122 MiB at the same epoch time; PyG's eager
#: steps ran 1.3-1.6x slower with it, so eager runs keep PyTorch's default.
AUTO_CUBLAS_WORKSPACE_KIB = 1024


def cublas_workspace_for(setting, captured: bool) -> Optional[int]:
    """The ``cublas_workspace_kib`` of a run in KiB (``None``: PyTorch's
    default): ``auto`` is :data:`AUTO_CUBLAS_WORKSPACE_KIB` for runs whose
    steps replay CUDA graphs and PyTorch's default for eager steps."""
    if setting == "auto":
        return AUTO_CUBLAS_WORKSPACE_KIB if captured else None
    return setting


#: whether :func:`set_cublas_workspace` changed the size in this process
_WORKSPACE_SET = False


def set_cublas_workspace(kib: Optional[int], device: torch.device) -> Optional[str]:
    """Size the cuBLAS workspaces of this process to ``kib`` KiB (the
    ``cublas_workspace_kib`` key); returns the line to log (``None``: not a
    CUDA run).

    PyTorch gives every (cuBLAS handle, stream) pair its own workspace from the
    caching allocator and keeps it for the life of the process: 32 MiB each on
    Hopper and Blackwell.  A training step uses at least two handles (the
    forward's thread and autograd's backward thread), so two workspaces stay
    allocated: 64 MiB, a third of a captured GT step's peak (docs/BENCHMARKS.md,
    sessions 9 and 21).  The GEMMs of these models are ``[N, hidden] x
    [hidden, k hidden]`` and do not need them.

    Where torch has :func:`torch.backends.cuda.cublas_workspace_size` (2.13
    has it, 2.11 does not) it is called; older versions read
    ``CUBLAS_WORKSPACE_CONFIG`` once, at the process's first cuBLAS call, so
    it is set in the environment (it then applies if no GEMM ran before this
    run started, as in ``dfgnn train``).  A ``CUBLAS_WORKSPACE_CONFIG`` the
    user exported is kept.  ``kib=None`` is PyTorch's default: it undoes what
    an earlier run of the same process set, where it still can.
    """
    global _WORKSPACE_SET
    if device.type != "cuda":
        return None
    if kib is None:   # undo what an earlier run of this process set
        note = ""
        if _WORKSPACE_SET and hasattr(torch._C, "_cuda_resetCublasWorkspaceSize"):
            torch._C._cuda_resetCublasWorkspaceSize()
            if hasattr(torch._C, "_cuda_resetCublasLtWorkspaceSize"):
                torch._C._cuda_resetCublasLtWorkspaceSize()
        ours = os.environ.get("_PYG_DFGNN_CUBLAS_WS")
        if ours is not None and os.environ.get("CUBLAS_WORKSPACE_CONFIG") == ours:
            del os.environ["CUBLAS_WORKSPACE_CONFIG"], os.environ["_PYG_DFGNN_CUBLAS_WS"]
            note = (f" (an earlier run of this process set CUBLAS_WORKSPACE_CONFIG={ours}, "
                    f"which stays in effect if cuBLAS has read it)")
        _WORKSPACE_SET = False
        return "cublas workspace: PyTorch's default" + note
    user = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    if user is not None and os.environ.get("_PYG_DFGNN_CUBLAS_WS") != user:
        return (f"cublas workspace: CUBLAS_WORKSPACE_CONFIG={user} from the environment "
                f"(cublas_workspace_kib: {kib} not applied)")
    size = int(kib) * 1024
    _WORKSPACE_SET = True
    if hasattr(torch._C, "_cuda_setCublasWorkspaceSize"):   # (CUDA builds of newer torch)
        torch.backends.cuda.cublas_workspace_size(size)
        if hasattr(torch._C, "_cuda_setCublasLtWorkspaceSize") \
                and torch.backends.cuda.cublaslt_workspace_size() > size:
            torch.backends.cuda.cublaslt_workspace_size(size)
        how = "torch.backends.cuda.cublas_workspace_size"
    else:
        value = f":{int(kib)}:1"
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = value
        os.environ["_PYG_DFGNN_CUBLAS_WS"] = value   # ours, so a later run may change it
        how = (f"CUBLAS_WORKSPACE_CONFIG={value}; applies from this process's first "
               f"cuBLAS call")
    return f"cublas workspace: {kib} KiB per handle and stream ({how})"
