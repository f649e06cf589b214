"""Training configuration: a schema of dataclasses, YAML loading, ``key=value`` overrides.

Every key is declared below with its type, default and (where it applies) the
allowed values.  :func:`load_config` reads a YAML file, applies command-line
overrides (dotted keys, values parsed as YAML scalars) and validates the
result, raising :class:`ConfigError` -- naming the key and what is allowed --
for unknown keys, wrong types, bad choices or a missing data set, *before*
anything is loaded or trained.
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import os
import tempfile
import re
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Union

import yaml

__all__ = ["ConfigError", "TrainConfig", "DataConfig", "ModelConfig", "OptimizerConfig",
           "SchedulerConfig", "EarlyStoppingConfig", "LogConfig", "CheckpointConfig",
           "CompileConfig", "load_config", "check_environment", "config_from_dict",
           "apply_overrides", "parse_overrides", "config_to_dict", "describe_schema"]

DATASETS = ("PATTERN", "CLUSTER", "Cora", "CiteSeer", "PubMed",
            "synthetic_uniform", "synthetic_powerlaw", "file", "pyg")

#: ``data.eval`` modes (see pyg_dfgnn/train/sampling.py)
EVAL_MODES = ("auto", "sampled", "layerwise", "full")


class ConfigError(ValueError):
    """Invalid configuration; the message names the key and the allowed values."""


def _f(default, choices: Optional[Sequence] = None, help: str = "", **kw):
    md = {"help": help}
    if choices is not None:
        md["choices"] = tuple(choices)
    md.update(kw)
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=md)
    return field(default=default, metadata=md)


# ----------------------------------------------------------------------------
# schema
# ----------------------------------------------------------------------------
@dataclass
class DataConfig:
    name: Optional[str] = _f(None, DATASETS, "data set (required)", required=True)
    root: str = _f("data/", help="data root: <root>/PATTERN, <root>/Cora/raw, ...")
    source: str = _f("auto", ("auto", "pyg", "generated"),
                     "PATTERN/CLUSTER: auto = PyG files if present else the built-in "
                     "generator; pyg = require PyG files; generated = always generate")
    download: bool = _f(False, help="let PyG download missing files (needs network)")
    num_train: Optional[int] = _f(None, help="number of training graphs (SBM), default: all")
    num_val: Optional[int] = _f(None, help="number of validation graphs (SBM)")
    num_test: Optional[int] = _f(None, help="number of test graphs (SBM)")
    gen_seed: Optional[int] = _f(0, help="seed of the SBM / synthetic generator and of the "
                                         "random node split (null = the run's seed)")
    num_workers: int = _f(0, help="DataLoader worker processes")
    batcher: str = _f("auto", ("auto", "store", "pyg"),
                      "graph data sets: store = batches from pyg_dfgnn.data.GraphBatcher "
                      "(graphs validated and target-sorted once, a batch is a few slice "
                      "copies; backend=fused: its CSR views built on the device without "
                      "a host sync); pyg = PyG's DataLoader (num_workers, prepare_graphs); "
                      "auto = store where the graphs allow it, else pyg")
    prepare_graphs: bool = _f(False, help="batcher=pyg, backend=fused, num_workers > 0: "
                                         "build each batch's CSR in the DataLoader workers "
                                         "and hand it to the layers' graph cache "
                                         "(pyg_dfgnn.data.PrepareGraphs); false (or "
                                         "num_workers=0) = the layers convert each batch on "
                                         "the device")
    normalize_features: bool = _f(False, help="Planetoid: row-normalise the bag-of-words "
                                              "features (as the GAT / AGNN papers)")
    # a user's node-level graph (data.name=file / pyg)
    path: Optional[str] = _f(None, help="data.name=file: a torch.save'd "
                                        "torch_geometric.data.Data (or dict) with x, edge_index, "
                                        "y and optional train_mask / val_mask / test_mask")
    pyg_class: Optional[str] = _f(None, help="data.name=pyg: a class of "
                                             "torch_geometric.datasets holding one graph, "
                                             "instantiated as cls(root=data.root, "
                                             "**data.pyg_kwargs), e.g. Planetoid, Amazon, Reddit")
    pyg_kwargs: Dict[str, Any] = _f({}, help="data.name=pyg: further constructor arguments, "
                                            "e.g. {name: Photo}")
    split: List[float] = _f([0.6, 0.2, 0.2], help="train / val / test fractions of the seeded "
                                                  "random node split (synthetic graphs; file / "
                                                  "pyg graphs without masks)")
    # synthetic graphs (scale runs)
    num_nodes: int = _f(100_000, help="synthetic: number of nodes")
    num_edges: int = _f(1_000_000, help="synthetic: number of edges")
    max_degree: int = _f(10_000, help="synthetic_powerlaw: largest (super node) degree")
    num_features: int = _f(64, help="synthetic: feature width")
    num_classes: int = _f(8, help="synthetic: number of classes")
    # neighbour-sampled mini-batches (pyg_dfgnn/train/sampling.py)
    loader: str = _f("full", ("full", "neighbor"),
                     "full = whole graph per step (Planetoid, synthetic) / graph mini-batches "
                     "(SBM); neighbor = PyG NeighborLoader, batch_size seed nodes per step")
    num_neighbors: List[int] = _f([15, 10, 5], help="loader=neighbor: neighbours sampled per "
                                                    "hop (one entry per layer, -1 = all)")
    sample_on: str = _f("auto", ("auto", "cpu", "cuda"),
                        "loader=neighbor: where the batches are sampled. cpu = PyG "
                        "NeighborLoader, num_workers worker processes, each batch copied to "
                        "the device; cuda = the graph (CSC, features, labels, masks) moved to "
                        "the device once, every batch sampled and gathered there (no workers, "
                        "no host copies; needs a CUDA device); auto = cuda when the run is on "
                        "CUDA and the graph takes <= 25% of the free device memory, else cpu")
    eval: str = _f("auto", EVAL_MODES,
                   "evaluation of one-graph data sets: full = one forward over the whole graph "
                   "on the device; sampled = the training fan-out around the val/test seeds "
                   "(loader=neighbor); layerwise = exact full-graph inference layer by layer, "
                   "eval_batch_size target nodes at a time (loader=neighbor); auto = sampled "
                   "with loader=neighbor, else full")
    eval_batch_size: Optional[int] = _f(None, help="data.eval=sampled / layerwise: seed / "
                                                   "target nodes per evaluation batch (null = "
                                                   "batch_size)")


@dataclass
class ModelConfig:
    name: str = _f("gat", ("gat", "gt", "agnn"),
                   "gat = GAT (benchmarking-gnns / Velickovic); gt = Graph Transformer "
                   "(Dwivedi & Bresson); agnn = AGNN (Thekumparampil et al.)")
    hidden: int = _f(128, help="hidden width (all heads together); per head = hidden / heads")
    heads: int = _f(8, help="attention heads (gat, gt)")
    layers: int = _f(4, help="number of attention layers")
    out_dim: Optional[int] = _f(None, help="width of the last attention layer (default: hidden)")
    out_heads: int = _f(1, help="gat with readout=conv: heads of the output layer (averaged)")
    dropout: float = _f(0.0, help="feature dropout between layers")
    attn_dropout: float = _f(0.0, help="dropout on attention coefficients (gat, gt)")
    in_dropout: float = _f(0.0, help="dropout on the input features / embedding")
    batch_norm: bool = _f(True, help="BatchNorm after each layer")
    layer_norm: bool = _f(False, help="LayerNorm after each layer (gt)")
    residual: bool = _f(True, help="residual connections")
    readout: str = _f("mlp", ("mlp", "linear", "conv"),
                      "node classifier: mlp = benchmarking-gnns MLPReadout (3 layers), "
                      "linear = one Linear, conv = the last GATConv outputs the classes (gat)")
    self_loops: bool = _f(True, help="add self-loops inside GATConv / AGNNConv")
    lap_pe: bool = _f(False, help="gt: add Laplacian eigenvector positional encodings")
    lap_pe_dim: int = _f(2, help="gt: number of Laplacian eigenvectors")
    agnn_fixed_first: bool = _f(False, help="agnn: first propagation layer has a fixed beta")


@dataclass
class OptimizerConfig:
    name: str = _f("adam", ("adam", "adamw", "sgd"))
    lr: float = _f(1e-3, help="learning rate")
    weight_decay: float = _f(0.0)
    momentum: float = _f(0.9, help="sgd only")
    implementation: str = _f("auto", ("auto", "fused", "foreach"),
                             "adam/adamw: fused = torch's one-kernel CUDA optimizer (no "
                             "per-parameter host work: the step of a 10-layer model "
                             "on small batches is host-bound); foreach = torch's "
                             "default; auto = fused on CUDA")


@dataclass
class SchedulerConfig:
    name: str = _f("plateau", ("none", "plateau", "cosine", "step"),
                   "plateau = ReduceLROnPlateau on the validation loss")
    factor: float = _f(0.5, help="plateau/step: LR multiplier")
    patience: int = _f(5, help="plateau: epochs without improvement before reducing")
    min_lr: float = _f(1e-5, help="plateau: stop threshold (stop_at_min_lr) or LR floor; "
                                  "cosine: eta_min")
    step_size: int = _f(50, help="step: epochs between reductions")
    stop_at_min_lr: bool = _f(True, help="plateau: stop training once the LR falls below "
                                         "min_lr (benchmarking-gnns); false = min_lr is a floor")


@dataclass
class EarlyStoppingConfig:
    patience: int = _f(0, help="stop after this many epochs without val improvement (0 = off)")
    monitor: str = _f("val_loss", ("val_loss", "val_metric"))
    min_delta: float = _f(0.0)


@dataclass
class LogConfig:
    progress: bool = _f(True, help="tqdm progress bar per epoch (only on a tty)")
    every: int = _f(1, help="print the epoch line every N epochs")


@dataclass
class CheckpointConfig:
    enabled: bool = _f(True, help="write checkpoint_last.pt / checkpoint_best.pt to out_dir")
    monitor: str = _f("val_metric", ("val_metric", "val_loss"),
                      "what defines the best checkpoint")


#: ``torch.compile`` modes accepted by ``compile.mode``
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass
class CompileConfig:
    """``compile: false | true | {dynamic: true, mode: ...}``: a bare bool sets
    ``enabled``; a mapping without ``enabled`` means ``enabled: true``."""

    #: the key a bare scalar sets (``compile: true``)
    _shorthand = "enabled"

    enabled: bool = _f(False, help="wrap the model in torch.compile")
    dynamic: Optional[bool] = _f(True, help="torch.compile(dynamic=...): true = shapes are "
                                            "symbolic from the start (every batch has other "
                                            "sizes); null = PyTorch decides")
    mode: str = _f("default", COMPILE_MODES, "torch.compile(mode=...)")
    backend: str = _f("inductor", help="torch.compile(backend=...), e.g. inductor, aot_eager, "
                                       "eager")
    fullgraph: bool = _f(False, help="torch.compile(fullgraph=...): fail on a graph break")


@dataclass
class TrainConfig:
    name: str = _f("run", help="run name (used in the default out_dir)")
    seed: int = _f(41, help="training seed (model init, shuffling, dropout)")
    device: str = _f("auto", help="auto (CUDA when present), cpu, cuda or cuda:N")
    backend: str = _f("fused", ("fused", "pyg"),
                      "fused = pyg_dfgnn.nn layers, pyg = torch_geometric.nn layers")
    epochs: int = _f(100, help="maximum number of epochs")
    max_steps_per_epoch: Optional[int] = _f(None, help="stop each training epoch after this "
                                                       "many optimiser steps (null = the whole "
                                                       "split); results.json records the cap")
    batch_size: int = _f(128, help="graphs per mini-batch (graph data sets); seed nodes "
                                   "per step with data.loader=neighbor (per rank)")
    out_dir: str = _f("runs/{name}", help="output directory ({name} is substituted)")
    resume: Union[bool, str, None] = _f(None, help="true = out_dir/checkpoint_last.pt, "
                                                   "or a checkpoint path")
    time_limit_min: Optional[float] = _f(None, help="stop after this many minutes")
    memory_check: bool = _f(True, help="estimate the peak memory of a step at start (logged) "
                                       "and refuse a run that would not fit the device "
                                       "(exit 2); false = log only")
    eval_test_every: int = _f(0, help="evaluate the test split every N epochs (0 = only "
                                      "at the end)")
    precision: str = _f("fp32", ("fp32", "bf16", "fp16"),
                        "fp32; bf16 / fp16 = torch.autocast on the training device (the fused "
                        "attention runs in that dtype), fp16 with a GradScaler")
    attention_backward: str = _f(
        "auto", ("auto", "store", "recompute"),
        "backend=fused on CUDA: the attention backward's column pass; store = keep each "
        "edge's alpha and dS (fp32, E x heads x 8 bytes while a layer's backward runs; GAT: "
        "E x heads x 4), "
        "recompute = recompute them from the row statistics (no per-edge memory, a slower "
        "column pass), auto = store unless short of memory (or as PYG_DFGNN_BACKWARD says); "
        "GAT without edge features keeps nothing per edge in auto and recompute (atomic row "
        "sums, not bit-reproducible) unless torch.use_deterministic_algorithms is on")
    cublas_workspace_kib: Union[int, str, None] = _f(
        "auto", help="CUDA: cuBLAS workspace per (handle, stream) in KiB (PyTorch's default "
                     "is 32 MiB on Hopper, kept for the life of the process; a training step "
                     "holds two); auto = 1024 where the steps replay CUDA graphs (measured "
                     "no slower there), else PyTorch's default; an int = that size for "
                     "any run; null = PyTorch's default; an exported "
                     "CUBLAS_WORKSPACE_CONFIG wins")
    compile: CompileConfig = field(default_factory=CompileConfig)
    cuda_graphs: Union[bool, str] = _f(
        False, help="capture the training step and the evaluation forward as CUDA graphs "
                    "(batches of small graphs on CUDA; batches padded to a fixed size, see "
                    "docs/TRAINING.md); auto = on where the run allows it (backend=fused on "
                    "CUDA, ...), else off with a log line saying why")
    cuda_graph_buckets: int = _f(4, help="cuda_graphs: size buckets (1..5), each with its own "
                                         "captured graphs; a batch is padded to the smallest "
                                         "that holds it (1 = the worst case only)")
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    early_stopping: EarlyStoppingConfig = field(default_factory=EarlyStoppingConfig)
    log: LogConfig = field(default_factory=LogConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)

    def resolved_out_dir(self) -> str:
        return self.out_dir.replace("{name}", self.name)


# ----------------------------------------------------------------------------
# type checking
# ----------------------------------------------------------------------------
_MAX_SEED = 2 ** 63 - 1   # torch.manual_seed / torch.Generator take 64-bit seeds
_FLOAT_RE = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def _type_name(tp) -> str:
    origin = typing.get_origin(tp)
    if origin is Union:
        return " or ".join("null" if a is type(None) else _type_name(a)
                           for a in typing.get_args(tp))
    if origin is list:
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    if origin is dict:
        return "mapping"
    return getattr(tp, "__name__", str(tp))


def _coerce(value, tp, key: str):
    """Return ``value`` converted to ``tp`` or raise ConfigError."""
    origin = typing.get_origin(tp)
    if origin is Union:
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key)
            except ConfigError as e:
                errors.append(e)
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got "
                          f"{type(value).__name__} {value!r}")
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif tp is float:
        v = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                v = float(value)
            except OverflowError:  # an int too large for a float
                v = math.inf
        # YAML 1.1 reads "1e-3" as a string; accept it as a number
        elif isinstance(value, str) and _FLOAT_RE.match(value.strip()):
            v = float(value)
        if v is not None:
            if not math.isfinite(v):  # .nan / .inf / 1e999 are never meaningful here
                raise ConfigError(f"{key}: must be a finite number, got {value!r}")
            return v
    elif typing.get_origin(tp) is list:
        (item,) = typing.get_args(tp)
        if isinstance(value, str):  # an override: "[15, 10, 5]"
            try:
                value = yaml.safe_load(value)
            except yaml.YAMLError:
                pass
        if isinstance(value, (list, tuple)):
            return [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    elif typing.get_origin(tp) is dict:
        if isinstance(value, str):  # an override: "{name: Photo}"
            try:
                value = yaml.safe_load(value)
            except yaml.YAMLError:
                pass
        if value is None:
            return {}
        if isinstance(value, dict):
            bad = [k for k in value if not isinstance(k, str)]
            if bad:
                raise ConfigError(f"{key}: keys must be strings, got {bad[0]!r}")
            return dict(value)
    elif tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
    else:  # pragma: no cover - schema uses only the types above
        return value
    raise ConfigError(f"{key}: expected {_type_name(tp)}, got {type(value).__name__} "
                      f"{value!r}")


def _hints(cls) -> Dict[str, Any]:
    return typing.get_type_hints(cls)


def _allowed_keys_msg(cls, prefix: str) -> str:
    names = [f.name for f in dataclasses.fields(cls)]
    where = f"'{prefix.rstrip('.')}'" if prefix else "the top level"
    return f"allowed keys in {where}: {', '.join(names)}"


def _unknown_key(key: str, cls, prefix: str) -> ConfigError:
    names = [f.name for f in dataclasses.fields(cls)]
    close = difflib.get_close_matches(key, names, n=1)
    hint = f" (did you mean '{prefix}{close[0]}'?)" if close else ""
    return ConfigError(f"unknown key '{prefix}{key}'{hint}; {_allowed_keys_msg(cls, prefix)}")


def _expand_shorthand(cls, raw: Any) -> Any:
    """A section with a ``_shorthand`` key (``compile``): a bare scalar sets that
    key; a mapping without it sets it to true."""
    key = getattr(cls, "_shorthand", None)
    if key is None:
        return raw
    if isinstance(raw, dict):
        return raw if key in raw else {key: True, **raw}
    if raw is None:
        return {}
    return {key: raw}


def _build(cls, raw: Any, prefix: str = ""):
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"'{prefix.rstrip('.') or 'config'}' must be a mapping of keys, "
                          f"got {type(raw).__name__} {raw!r}; {_allowed_keys_msg(cls, prefix)}")
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in raw.items():
        key = str(key)
        if key not in fields:
            raise _unknown_key(key, cls, prefix)
        tp = hints[key]
        full = prefix + key
        if dataclasses.is_dataclass(tp):
            kwargs[key] = _build(tp, _expand_shorthand(tp, value), full + ".")
            continue
        v = _coerce(value, tp, full)
        choices = fields[key].metadata.get("choices")
        if choices is not None and v is not None:
            match = [c for c in choices if str(c).lower() == str(v).lower()]
            if not match:
                raise ConfigError(f"{full}: {v!r} is not allowed; choose one of: "
                                  f"{', '.join(map(str, choices))}")
            v = match[0]
        kwargs[key] = v
    for name in fields:  # absent sections still get their required keys checked
        if name not in kwargs and dataclasses.is_dataclass(hints[name]):
            kwargs[name] = _build(hints[name], {}, prefix + name + ".")
    obj = cls(**kwargs)
    for name, f in fields.items():
        if f.metadata.get("required") and getattr(obj, name) is None:
            choices = f.metadata.get("choices")
            allowed = f"; choose one of: {', '.join(choices)}" if choices else ""
            raise ConfigError(f"{prefix}{name} is required (missing){allowed}")
    return obj


def _validate(cfg: TrainConfig) -> None:
    m, d = cfg.model, cfg.data

    def positive(key, v, allow_zero=False):
        if v is None:
            return
        if v < 0 or (v == 0 and not allow_zero):
            raise ConfigError(f"{key}: must be {'>= 0' if allow_zero else '> 0'}, got {v}")

    for key, v in (("epochs", cfg.epochs), ("batch_size", cfg.batch_size),
                   ("model.hidden", m.hidden), ("model.heads", m.heads),
                   ("model.layers", m.layers), ("model.out_dim", m.out_dim),
                   ("model.out_heads", m.out_heads), ("model.lap_pe_dim", m.lap_pe_dim),
                   ("optimizer.lr", cfg.optimizer.lr), ("log.every", cfg.log.every)):
        positive(key, v)
    for key, v in (("data.num_workers", d.num_workers),
                   ("eval_test_every", cfg.eval_test_every),
                   ("early_stopping.patience", cfg.early_stopping.patience),
                   ("optimizer.weight_decay", cfg.optimizer.weight_decay)):
        positive(key, v, allow_zero=True)
    for key, v in (("data.num_train", d.num_train), ("data.num_val", d.num_val),
                   ("data.num_test", d.num_test)):
        if v is not None and v <= 0:   # an empty split cannot be trained or evaluated on
            raise ConfigError(f"{key}: must be > 0 (or null = the whole split), got {v}")
    for key, v in (("time_limit_min", cfg.time_limit_min),
                   ("scheduler.step_size", cfg.scheduler.step_size),
                   ("data.num_nodes", d.num_nodes), ("data.num_edges", d.num_edges),
                   ("data.max_degree", d.max_degree), ("data.num_features", d.num_features)):
        positive(key, v)
    for key, v in (("scheduler.patience", cfg.scheduler.patience),
                   ("scheduler.min_lr", cfg.scheduler.min_lr),
                   ("early_stopping.min_delta", cfg.early_stopping.min_delta)):
        positive(key, v, allow_zero=True)
    for key, v in (("model.dropout", m.dropout), ("model.attn_dropout", m.attn_dropout),
                   ("model.in_dropout", m.in_dropout),
                   ("optimizer.momentum", cfg.optimizer.momentum)):
        if not 0.0 <= v < 1.0:
            raise ConfigError(f"{key}: must be in [0, 1), got {v}")
    if not 0.0 < cfg.scheduler.factor < 1.0:
        raise ConfigError(f"scheduler.factor: must be in (0, 1) (the LR is multiplied by it), "
                          f"got {cfg.scheduler.factor}")
    for key, v in (("seed", cfg.seed), ("data.gen_seed", d.gen_seed)):
        if v is not None and not 0 <= v <= _MAX_SEED:
            raise ConfigError(f"{key}: must be in [0, 2**63 - 1], got {v}")
    if d.num_classes < 2:
        raise ConfigError(f"data.num_classes: must be >= 2, got {d.num_classes}")
    if d.name in ("synthetic_uniform", "synthetic_powerlaw"):
        n = d.num_nodes
        if n < 2:
            raise ConfigError(f"data.num_nodes: must be >= 2 for {d.name}, got {n}")
        if d.num_edges > n * (n - 1):
            raise ConfigError(f"data.num_edges: {d.num_edges} exceeds the {n * (n - 1)} "
                              f"possible edges of a simple graph on data.num_nodes={n}")
        if d.name == "synthetic_powerlaw":
            if d.max_degree > n - 1:
                raise ConfigError(f"data.max_degree: must be <= data.num_nodes - 1 = {n - 1}, "
                                  f"got {d.max_degree}")
            if not d.max_degree <= d.num_edges <= d.max_degree * n:
                raise ConfigError(f"data.num_edges: must be in [data.max_degree, "
                                  f"data.max_degree * data.num_nodes] = [{d.max_degree}, "
                                  f"{d.max_degree * n}] for synthetic_powerlaw, "
                                  f"got {d.num_edges}")
    if not cfg.out_dir.strip() or not cfg.resolved_out_dir().strip():
        raise ConfigError(f"out_dir: must be a directory path, got {cfg.out_dir!r}")
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", cfg.device):
        raise ConfigError(f"device: {cfg.device!r} is not allowed; choose one of: auto, cpu, "
                          "cuda, cuda:N")
    if m.name in ("gat", "gt") and m.hidden % m.heads:
        raise ConfigError(f"model.hidden ({m.hidden}) must be divisible by model.heads "
                          f"({m.heads}) for model.name={m.name}")
    if m.name == "gt" and (m.out_dim or m.hidden) % m.heads:
        raise ConfigError(f"model.out_dim ({m.out_dim}) must be divisible by model.heads "
                          f"({m.heads}) for model.name=gt")
    if m.readout == "conv" and m.name != "gat":
        raise ConfigError(f"model.readout=conv is only available for model.name=gat; "
                          f"choose mlp or linear for {m.name}")
    if m.lap_pe and m.name != "gt":
        raise ConfigError("model.lap_pe=true is only available for model.name=gt")
    if m.lap_pe and d.name not in ("PATTERN", "CLUSTER"):
        raise ConfigError("model.lap_pe=true needs a graph data set (PATTERN or CLUSTER)")
    if d.source == "generated" and d.name not in ("PATTERN", "CLUSTER"):
        raise ConfigError(f"data.source=generated is only available for PATTERN and CLUSTER, "
                          f"not {d.name}")
    if cfg.compile.enabled:
        import torch._dynamo
        backends = [b for b in torch._dynamo.list_backends(exclude_tags=()) if "TESTING" not in b]
        if cfg.compile.backend not in backends:
            raise ConfigError(f"compile.backend: {cfg.compile.backend!r} is not a torch.compile "
                              f"backend; choose one of: {', '.join(backends)}")
    _validate_cuda_graphs(cfg)
    _validate_sampling(cfg)
    _validate_user_data(cfg)
    if cfg.max_steps_per_epoch is not None and cfg.max_steps_per_epoch <= 0:
        raise ConfigError(f"max_steps_per_epoch: must be > 0 (or null = the whole split), got "
                          f"{cfg.max_steps_per_epoch}")
    if isinstance(cfg.resume, str) and not cfg.resume:
        raise ConfigError("resume: empty path; use true, false/null or a checkpoint path")
    ws = cfg.cublas_workspace_kib
    if (isinstance(ws, str) and ws != "auto") or isinstance(ws, bool) \
            or (isinstance(ws, int) and ws < 0):
        raise ConfigError(f"cublas_workspace_kib: must be auto, a size >= 0 in KiB or null "
                          f"(PyTorch's default), got {ws!r}")


def _validate_cuda_graphs(cfg: TrainConfig) -> None:
    """``cuda_graphs``: what a replayed step cannot redo (pyg_dfgnn/train/graphed.py);
    the data-dependent conditions are checked when the data is loaded."""
    from .graphed import MAX_BUCKETS
    if not 1 <= cfg.cuda_graph_buckets <= MAX_BUCKETS:
        raise ConfigError(f"cuda_graph_buckets: must be 1..{MAX_BUCKETS} (1 = one worst-case "
                          f"size), got {cfg.cuda_graph_buckets}")
    if isinstance(cfg.cuda_graphs, str) and cfg.cuda_graphs != "auto":
        raise ConfigError(f"cuda_graphs: must be true, false or auto, got "
                          f"{cfg.cuda_graphs!r}")
    if cfg.cuda_graphs is True:
        reason = cuda_graphs_blocker(cfg)
        if reason is not None:
            raise ConfigError(f"cuda_graphs: {reason}")


def cuda_graphs_blocker(cfg: TrainConfig) -> Optional[str]:
    """Why this config cannot replay its steps as CUDA graphs (``None``: it
    can, as far as the config tells; the data and the device are checked when
    the run starts).  ``cuda_graphs: true`` turns the reason into a
    :class:`ConfigError`, ``cuda_graphs: auto`` into eager steps."""
    if cfg.device == "cpu":
        return "needs a CUDA device (device=cpu)"
    if cfg.precision == "fp16":
        return ("precision=fp16 needs a GradScaler, whose step decides on the host; use "
                "bf16 or fp32")
    if cfg.compile.enabled:
        return "use either compile or cuda_graphs, not both"
    if cfg.optimizer.name not in ("adam", "adamw"):
        return (f"optimizer.name={cfg.optimizer.name} has no capturable implementation "
                f"here; use adam or adamw")
    if cfg.data.loader == "neighbor" or cfg.data.name not in ("PATTERN", "CLUSTER", "pyg",
                                                                "file"):
        return (f"needs a data set of many small graphs (PATTERN, CLUSTER, or your own: "
                f"data.name=pyg/file), not data.name={cfg.data.name}"
                + (" with data.loader=neighbor" if cfg.data.loader == "neighbor" else ""))
    if cfg.data.batcher == "pyg":
        return ("needs data.batcher=auto or store (the padded batches are packed from the "
                "graph store)")
    if cfg.backend == "fused" and cfg.model.attn_dropout > 0:
        return ("the fused attention dropout draws its seed on the host per call, which a "
                "replay would repeat; set model.attn_dropout=0 or cuda_graphs=false")
    return None


def _validate_sampling(cfg: TrainConfig) -> None:
    """``data.loader`` / ``data.num_neighbors`` (see pyg_dfgnn/train/sampling.py)."""
    d = cfg.data
    if d.eval_batch_size is not None and d.eval_batch_size <= 0:
        raise ConfigError(f"data.eval_batch_size: must be > 0 (or null = batch_size), got "
                          f"{d.eval_batch_size}")
    if d.name in ("PATTERN", "CLUSTER") and d.eval != "auto":
        raise ConfigError(f"data.eval={d.eval} is for one-graph data sets; {d.name} is "
                          "evaluated in graph mini-batches (leave data.eval=auto)")
    if d.loader != "neighbor" and d.eval in ("sampled", "layerwise"):
        raise ConfigError(f"data.eval={d.eval} needs data.loader=neighbor (full-batch "
                          "training evaluates the whole graph: data.eval=full or auto)")
    if d.loader != "neighbor" and d.sample_on != "auto":
        raise ConfigError(f"data.sample_on={d.sample_on} needs data.loader=neighbor (it says "
                          "where the neighbour-sampled batches are made); leave it at auto")
    if d.loader != "neighbor":
        return
    if d.name in ("PATTERN", "CLUSTER"):
        raise ConfigError(f"data.loader=neighbor samples the nodes of one graph; {d.name} is "
                          "a data set of many small graphs (use data.loader=full)")
    if not d.num_neighbors:
        raise ConfigError("data.num_neighbors: must list one fan-out per layer, e.g. "
                          "[15, 10, 5], got []")
    bad = [k for k in d.num_neighbors if k == 0 or k < -1]
    if bad:
        raise ConfigError(f"data.num_neighbors: every entry must be > 0 or -1 (all "
                          f"neighbours), got {d.num_neighbors}")
    if len(d.num_neighbors) != cfg.model.layers:
        raise ConfigError(f"data.num_neighbors: {len(d.num_neighbors)} hops "
                          f"{d.num_neighbors} for model.layers={cfg.model.layers}; give one "
                          "fan-out per attention layer")


def _validate_user_data(cfg: TrainConfig) -> None:
    """``data.name=file`` / ``pyg`` keys and ``data.split`` (the file's content is
    checked when it is loaded: pyg_dfgnn/data/datasets.py, also a ConfigError)."""
    d = cfg.data
    if len(d.split) != 3 or any(not 0.0 <= f <= 1.0 for f in d.split) \
            or any(f <= 0.0 for f in d.split) or sum(d.split) > 1.0 + 1e-9:
        raise ConfigError(f"data.split: give 3 fractions (train, val, test), each > 0, "
                          f"summing to <= 1, got {d.split}")
    if d.name != "file" and d.path is not None:
        raise ConfigError(f"data.path is only used with data.name=file (data.name={d.name})")
    if d.name != "pyg" and (d.pyg_class is not None or d.pyg_kwargs):
        key = "data.pyg_class" if d.pyg_class is not None else "data.pyg_kwargs"
        raise ConfigError(f"{key} is only used with data.name=pyg (data.name={d.name})")
    if d.name == "file":
        if not d.path:
            raise ConfigError("data.path is required for data.name=file: a torch.save'd "
                              "torch_geometric.data.Data with x, edge_index and y")
        path = os.path.expanduser(d.path)
        if not os.path.exists(path):
            raise ConfigError(f"data.path: file not found: {d.path}")
        if not os.path.isfile(path):
            raise ConfigError(f"data.path: {d.path} is not a file")
    if d.name == "pyg":
        if not d.pyg_class:
            raise ConfigError("data.pyg_class is required for data.name=pyg: a class of "
                              "torch_geometric.datasets, e.g. Planetoid, Amazon, Reddit")
        pyg_dataset_class(d.pyg_class)
    if d.name in ("file", "pyg") and d.source != "auto":
        raise ConfigError(f"data.source={d.source} is only available for PATTERN and CLUSTER, "
                          f"not {d.name}")


def pyg_dataset_class(name: str):
    """The class ``torch_geometric.datasets.<name>``; ConfigError naming
    ``data.pyg_class`` when there is no such data set class."""
    import torch_geometric.datasets as tgd
    from torch_geometric.data import Dataset
    names = sorted(n for n in getattr(tgd, "__all__", dir(tgd))
                   if isinstance(getattr(tgd, n, None), type)
                   and issubclass(getattr(tgd, n), Dataset))
    cls = getattr(tgd, name, None) if name in names else None
    if cls is None:
        close = difflib.get_close_matches(name, names, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(f"data.pyg_class: {name!r} is not a data set class in "
                          f"torch_geometric.datasets{hint}; e.g. Planetoid, Amazon, Coauthor, "
                          "Flickr, Reddit")
    return cls


# ----------------------------------------------------------------------------
# overrides
# ----------------------------------------------------------------------------
def parse_overrides(items: Sequence[str]) -> List[tuple]:
    """``["model.heads=8", "out_dir=/tmp/x"]`` -> ``[("model.heads", 8), ("out_dir", "/tmp/x")]``.
    """
    out = []
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value "
                              "(e.g. model.heads=8)")
        key, text = item.split("=", 1)
        key = key.strip()
        if not key or any(not p for p in key.split(".")):
            raise ConfigError(f"override {item!r}: empty key")
        try:
            value = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError as e:
            raise ConfigError(f"override {item!r}: cannot parse the value ({e})") from None
        if isinstance(value, (dict, list)):
            value = text  # keep compound-looking text as a string; schema decides
        out.append((key, value))
    return out


def apply_overrides(raw: Dict[str, Any], overrides: Sequence[tuple]) -> Dict[str, Any]:
    """Set dotted keys in the nested dict ``raw`` (a copy is returned)."""
    raw = copy.deepcopy(raw) if raw else {}
    for key, value in overrides:
        parts = key.split(".")
        node, cls, prefix = raw, TrainConfig, ""
        for i, p in enumerate(parts):
            names = {f.name: f for f in dataclasses.fields(cls)}
            if p not in names:
                raise _unknown_key(p, cls, prefix)
            tp = _hints(cls)[p]
            last = i == len(parts) - 1
            if dataclasses.is_dataclass(tp):
                short = getattr(tp, "_shorthand", None)
                if last and short is not None:  # compile=true -> compile.enabled=true
                    sub = node.get(p)
                    if isinstance(sub, dict):
                        sub[short] = value
                    else:
                        node[p] = value
                    continue
                if last:
                    raise ConfigError(f"'{prefix}{p}' is a section; set its keys with "
                                      f"{prefix}{p}.<key>=value "
                                      f"({_allowed_keys_msg(tp, prefix + p + '.')})")
                sub = node.get(p)
                if not isinstance(sub, dict):
                    short = getattr(tp, "_shorthand", None)
                    sub = {short: sub} if short is not None and sub is not None else {}
                    node[p] = sub
                node, cls, prefix = sub, tp, prefix + p + "."
            else:
                if not last and typing.get_origin(tp) is dict and i == len(parts) - 2:
                    sub = node.get(p)      # a mapping key: data.pyg_kwargs.name=Photo
                    if not isinstance(sub, dict):
                        sub = {}
                        node[p] = sub
                    sub[parts[-1]] = value
                    break
                if not last:
                    raise ConfigError(f"'{prefix}{p}' is not a section; cannot set "
                                      f"'{key}'")
                node[p] = value
    return raw


# ----------------------------------------------------------------------------
# entry points
# ----------------------------------------------------------------------------
def config_from_dict(raw: Dict[str, Any]) -> TrainConfig:
    cfg = _build(TrainConfig, raw)
    _validate(cfg)
    return cfg


def _read_yaml(path: str) -> Any:
    """The YAML document in ``path``; every problem is a one-line :class:`ConfigError`."""
    if not os.path.exists(path):
        raise ConfigError(f"config file not found: {path}")
    if os.path.isdir(path):
        raise ConfigError(f"config path {path} is a directory, not a YAML file")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not a UTF-8 text file (byte 0x{data[e.start]:02x} at "
                          f"offset {e.start}); save the config as UTF-8") from None
    try:
        _check_duplicate_keys(yaml.compose(text, Loader=yaml.SafeLoader), path)
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML ({' '.join(str(e).split())})") from None


def _check_duplicate_keys(node, path: str, prefix: str = "") -> None:
    """YAML silently keeps the last of two equal keys; a config must not."""
    if isinstance(node, yaml.MappingNode):
        seen: Dict[str, int] = {}
        for k, v in node.value:
            key = str(k.value) if isinstance(k, yaml.ScalarNode) else None
            if key is not None and key != "<<":
                line = k.start_mark.line + 1
                if key in seen:
                    raise ConfigError(f"{path}: duplicate key '{prefix}{key}' (lines "
                                      f"{seen[key]} and {line}); keep one of them")
                seen[key] = line
            _check_duplicate_keys(v, path, f"{prefix}{key}." if key else prefix)
    elif isinstance(node, yaml.SequenceNode):
        for v in node.value:
            _check_duplicate_keys(v, path, prefix)


def load_config(path: Optional[str] = None, overrides: Sequence[str] = ()) -> TrainConfig:
    """Read ``path`` (YAML), apply ``key=value`` overrides, validate."""
    raw: Dict[str, Any] = {}
    if path is not None:
        raw = _read_yaml(path) or {}
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of keys")
    raw = apply_overrides(raw, parse_overrides(list(overrides)))
    return config_from_dict(raw)


def check_environment(cfg: TrainConfig, probe_out_dir: bool = True) -> None:
    """Checks of ``cfg`` against this machine, run at the start of training.

    * ``device: cuda[:N]`` needs CUDA (and device ``N``);
    * ``data.sample_on: cuda`` (with ``data.loader: neighbor``) needs a CUDA run;
    * ``out_dir`` must be writable: it is created and a file is created in it
      and removed again.  Actually writing (rather than ``os.access``) also
      catches read-only file systems and works for root, whom permission bits
      do not stop.

    Raises :class:`ConfigError` naming the key.
    """
    dev = cfg.device
    if dev.startswith("cuda"):
        import torch
        if not torch.cuda.is_available():
            how = ("this PyTorch build has no CUDA support" if torch.version.cuda is None
                   else "no CUDA GPU is visible")
            raise ConfigError(f"device: {dev!r} but CUDA is not available ({how}); use "
                              "device=auto (CUDA when present) or device=cpu")
        if ":" in dev:
            n = torch.cuda.device_count()
            if int(dev.split(":", 1)[1]) >= n:
                raise ConfigError(f"device: {dev!r} but this machine has {n} CUDA device(s) "
                                  f"(cuda:0 .. cuda:{n - 1})")
    d = cfg.data
    if d.loader == "neighbor" and d.sample_on == "cuda":
        import torch
        if dev == "cpu" or not torch.cuda.is_available():
            why = ("device=cpu" if dev == "cpu" else
                   "this PyTorch build has no CUDA support" if torch.version.cuda is None
                   else "no CUDA GPU is visible")
            raise ConfigError(f"data.sample_on: 'cuda' needs a CUDA run, but {why}; use "
                              "data.sample_on=auto (the GPU when the run is on CUDA) or cpu")
    if probe_out_dir:
        out = cfg.resolved_out_dir()
        try:
            os.makedirs(out, exist_ok=True)
            fd, probe = tempfile.mkstemp(dir=out, prefix=".dfgnn-write-test-")
            os.close(fd)
            os.remove(probe)
        except OSError as e:
            raise ConfigError(f"out_dir: cannot write to {out!r} ({e.strerror or e})") from None


def config_to_dict(cfg) -> Dict[str, Any]:
    return dataclasses.asdict(cfg)


def describe_schema(cls=TrainConfig, prefix: str = "") -> List[str]:
    """Lines ``key: type = default  [choices]  help`` for documentation / --help."""
    lines = []
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            lines.append(f"{prefix}{f.name}:")
            lines.extend(describe_schema(tp, prefix + f.name + "."))
            continue
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        choices = f.metadata.get("choices")
        ch = f"  [{' | '.join(map(str, choices))}]" if choices else ""
        hl = f.metadata.get("help", "")
        lines.append(f"  {prefix}{f.name}: {_type_name(tp)} = {default!r}{ch}"
                     + (f"  -- {hl}" if hl else ""))
    return lines
