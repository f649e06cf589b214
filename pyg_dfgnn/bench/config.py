"""Benchmark configuration: built-in defaults, YAML loading, ``--quick``,
and the case matrix a config expands to.

A config is a nested dict; a YAML file only needs the keys it changes
(they are deep-merged over :data:`BASE`).  ``configs/bench_default.yaml`` is
the full GPU suite and ``configs/bench_quick.yaml`` the CPU smoke run
(:data:`QUICK` is its built-in copy, used when the file is not around, e.g.
for an installed package).

The ``layers`` and ``ops`` sections each run a matrix of
``shapes`` (heads x channels per head) x ``dtypes`` per graph
(:func:`section_plan`, :func:`expand`):

* ``shapes: [[4, 64], [8, 10], "8x19"]`` -- ``[heads, channels]`` pairs or
  ``"HxC"`` strings; ``heads:`` + ``channels:`` is the one-shape shorthand
  (giving both forms is an error);
* ``dtypes:`` in a section overrides the top-level ``dtypes`` for it;
* ``only: {contender: {shapes: [...], dtypes: [...], graphs: [...]}}`` runs a
  contender only on the listed shapes / dtypes / graphs (each key optional;
  the other cases have no row for it) -- to keep expensive contenders
  (``pyg_sparse``, ``pyg_compile``) to a few cases;
* a graph entry may carry ``shapes:`` / ``dtypes:``: only those of the
  sections' shapes / dtypes run on that graph.

Any malformed entry raises :class:`ValueError` naming the key (``dfgnn bench``
exits with status 2).
"""
from __future__ import annotations

import copy
import os
from typing import Any, Dict, List, Optional, Tuple

BASE: Dict[str, Any] = {
    "name": "bench",
    "device": "auto",            # auto | cuda | cuda:N | cpu
    "dtypes": ["float32"],
    "seed": 0,
    "time_budget_s": None,       # no new case starts after this many seconds (skipped rows)
    "cpu_threads": None,         # torch.set_num_threads for the run (None: unchanged)
    "timing": {
        "warmup": 3,
        "repeats": 15,
        "max_measure_s": 5.0,    # fewer repeats (>= min_repeats) when one call is slow
        "min_repeats": 3,
        "min_measure_s": None,   # more repeats (<= max_repeats) when one call is fast
        "max_repeats": 200,
        "interleave": 1,         # rounds of timing blocks alternated between contenders
    },
    "check": {
        # max |out - ref| / max |ref| (also for the input and parameter gradients)
        "tolerance": {"float64": 1e-6, "float32": 1e-3, "float16": 2e-2, "bfloat16": 5e-2},
        "fp64_max_elements": 250_000_000,  # fp64 reference when E * H * F is at most this
        "cpu_fallback": True,    # reference on the CPU (forward only) if the GPU one OOMs
        "grads": True,           # compare input/parameter gradients as well
        "floor": 0.01,           # error denominator >= floor * largest gradient of its group
    },
    "graphs": [],
    "layers": {
        "enabled": True,
        "names": ["gat", "gatv2", "transformer", "agnn"],
        "shapes": None,          # [[heads, channels], ...]; None: [[heads, channels]]
        "heads": None,           # one-shape shorthand (default 4) ...
        "channels": None,        # ... channels per head (default 64); AGNN is
                                 # single-head with F = heads * channels
        "dtypes": None,          # None: the top-level dtypes
        "in_channels": 64,
        "contenders": ["fused", "pyg", "pyg_sparse", "pyg_compile"],
        "only": {},              # contender -> {shapes, dtypes, graphs} it is limited to
        "kwargs": {},            # per layer: extra constructor arguments
    },
    "compile": {
        "enabled": True,
        "graphs": None,          # graph names that get the pyg_compile contender (None: all)
        "dynamic": False,
        "mode": None,
        "budget_s": 180.0,       # total compile time; later compile contenders are skipped
    },
    "ops": {
        "enabled": False,
        "names": ["gat", "gatv2", "dot"],
        "shapes": None,          # as layers.shapes; None: [[heads, channels]]
        "heads": None,           # default 4
        "channels": None,        # default 64
        "dtypes": None,          # None: the top-level dtypes
        "contenders": ["fused", "naive"],
        "only": {},
        "graphs": None,          # None: all graphs
    },
    "train": {
        "enabled": False,
        "backends": ["fused", "pyg"],
        "epochs": 3,             # timed epochs (after warm-up epochs)
        "warmup_epochs": 1,
        "runs": [],              # list of training configs (dicts or YAML paths)
    },
    "plots": True,
}

QUICK: Dict[str, Any] = {
    "name": "quick",
    "device": "cpu",
    "dtypes": ["float32", "bfloat16"],
    "timing": {"warmup": 1, "repeats": 3, "max_measure_s": 1.0, "min_repeats": 2},
    "graphs": [
        {"name": "uniform_1k", "kind": "uniform", "num_nodes": 1000, "num_edges": 8000,
         "seed": 0},
        {"name": "powerlaw_1k", "kind": "powerlaw", "num_nodes": 1000, "num_edges": 8000,
         "max_degree": 800, "seed": 2, "dtypes": ["float32"]},
        {"name": "pattern_4", "kind": "pattern", "num_graphs": 4, "seed": 0,
         "shapes": [[8, 10]], "dtypes": ["float32"]},
    ],
    "layers": {"shapes": [[4, 64], [8, 10]], "in_channels": 16,
               "only": {"pyg_sparse": {"shapes": [[4, 64]], "dtypes": ["float32"]},
                        "pyg_compile": {"shapes": [[4, 64]], "dtypes": ["float32"]}}},
    "compile": {"enabled": False},
    "ops": {"enabled": True, "shapes": [[4, 64], [8, 10]],
            "graphs": ["uniform_1k", "powerlaw_1k"]},
    "train": {"enabled": True, "epochs": 1, "warmup_epochs": 0},
}

#: what ``--quick`` changes in an explicitly given config
QUICK_OVERRIDES: Dict[str, Any] = {
    "timing": {"warmup": 1, "repeats": 3, "max_measure_s": 1.0, "min_repeats": 2},
    "compile": {"enabled": False},
    "train": {"epochs": 1, "warmup_epochs": 0},
}


def deep_merge(base: Dict[str, Any], over: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in (over or {}).items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def repo_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def find_config(name: str) -> Optional[str]:
    """``configs/bench_<name>.yaml`` relative to the CWD or the checkout."""
    for base in (os.getcwd(), repo_root()):
        p = os.path.join(base, "configs", f"bench_{name}.yaml")
        if os.path.isfile(p):
            return p
    return None


def load_yaml(path: str) -> Dict[str, Any]:
    import yaml
    with open(path) as f:
        data = yaml.safe_load(f) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a benchmark config must be a mapping, got "
                         f"{type(data).__name__}")
    return data


def load_config(path: Optional[str] = None, quick: bool = False) -> Dict[str, Any]:
    """Resolve the config: ``path`` (merged over :data:`BASE`), else the quick
    or default config file, else the built-in quick config."""
    if path is None:
        found = find_config("quick" if quick else "default")
        if found is not None:
            cfg = deep_merge(BASE, load_yaml(found))
            cfg["_source"] = found
            return cfg
        if not quick:
            raise FileNotFoundError("configs/bench_default.yaml not found; pass a config "
                                    "path or --quick")
        cfg = deep_merge(BASE, QUICK)
        cfg["_source"] = "built-in quick config"
        return cfg
    if not os.path.isfile(path):
        alt = find_config(path)  # allow `dfgnn bench quick`
        if alt is None:
            raise FileNotFoundError(f"benchmark config {path!r} not found")
        path = alt
    cfg = deep_merge(BASE, load_yaml(path))
    if quick:
        cfg = deep_merge(cfg, QUICK_OVERRIDES)
    cfg["_source"] = path
    return cfg


# --------------------------------------------------------------------------- #
# the case matrix: shapes x dtypes per section and graph
# --------------------------------------------------------------------------- #

Shape = Tuple[int, int]

#: config section key -> (row ``section``, known contenders, baseline, default names)
SECTIONS: Dict[str, Tuple[str, Tuple[str, ...], str]] = {
    "layers": ("layer", ("fused", "pyg", "pyg_sparse", "pyg_compile"), "pyg"),
    "ops": ("op", ("fused", "naive"), "naive"),
}
_ONLY_KEYS = ("shapes", "dtypes", "graphs")
_DEFAULT_SHAPE: Shape = (4, 64)


def _pos_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def parse_shape(value: Any, key: str) -> Shape:
    """``[heads, channels]`` or ``"HxC"`` -> ``(heads, channels)``; anything
    else is a :class:`ValueError` naming ``key``."""
    h = c = None
    if isinstance(value, str):
        parts = value.lower().replace(" ", "").split("x")
        if len(parts) == 2 and all(p.isdigit() for p in parts):
            h, c = int(parts[0]), int(parts[1])
    elif isinstance(value, (list, tuple)) and len(value) == 2:
        h, c = value
    if not (_pos_int(h) and _pos_int(c)):
        raise ValueError(f"{key}: expected [heads, channels] (two positive integers) or "
                         f"'HxC', got {value!r}")
    return int(h), int(c)


def shape_label(shape: Shape) -> str:
    return f"{shape[0]}x{shape[1]}"


def _shape_list(value: Any, key: str) -> List[Shape]:
    if isinstance(value, (str, tuple)) or (isinstance(value, list) and len(value) == 2
                                           and all(_pos_int(v) for v in value)):
        raise ValueError(f"{key}: expected a list of shapes, e.g. [[4, 64], [8, 10]] "
                         f"(one shape: [[4, 64]]), got {value!r}")
    if not isinstance(value, list) or not value:
        raise ValueError(f"{key}: expected a non-empty list of [heads, channels] pairs, "
                         f"got {value!r}")
    out: List[Shape] = []
    for i, v in enumerate(value):
        s = parse_shape(v, f"{key}[{i}]")
        if s in out:
            raise ValueError(f"{key}[{i}]: shape {shape_label(s)} is listed twice")
        out.append(s)
    return out


def _dtype_list(value: Any, key: str) -> List[str]:
    import torch
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"{key}: expected a non-empty list of dtype names, e.g. "
                         f"[float32, bfloat16], got {value!r}")
    out: List[str] = []
    for i, v in enumerate(value):
        dt = getattr(torch, str(v), None)
        if not isinstance(dt, torch.dtype) or not dt.is_floating_point:
            raise ValueError(f"{key}[{i}]: unknown floating dtype {v!r} (float32, float16, "
                             f"bfloat16, float64)")
        name = str(dt).replace("torch.", "")
        if name in out:
            raise ValueError(f"{key}[{i}]: dtype {name} is listed twice")
        out.append(name)
    return out


def _section(cfg: Dict[str, Any], key: str) -> Dict[str, Any]:
    sc = cfg.get(key)
    if sc is None:
        return {}
    if not isinstance(sc, dict):
        raise ValueError(f"{key}: expected a mapping, got {type(sc).__name__}")
    return sc


def section_shapes(cfg: Dict[str, Any], key: str) -> List[Shape]:
    """The shapes of section ``key`` (``layers`` / ``ops``): ``shapes``, else
    the one-shape shorthand ``heads`` x ``channels`` (defaults 4 x 64)."""
    sc = _section(cfg, key)
    if sc.get("shapes") is not None:
        given = [k for k in ("heads", "channels") if sc.get(k) is not None]
        if given:
            raise ValueError(f"{key}: give either {key}.shapes or the one-shape shorthand "
                             f"{key}.heads/{key}.channels, not both (got shapes and "
                             f"{'/'.join(given)})")
        return _shape_list(sc["shapes"], f"{key}.shapes")
    h = sc.get("heads", None)
    c = sc.get("channels", None)
    h = _DEFAULT_SHAPE[0] if h is None else h
    c = _DEFAULT_SHAPE[1] if c is None else c
    for name, v in (("heads", h), ("channels", c)):
        if not _pos_int(v):
            raise ValueError(f"{key}.{name}: expected a positive integer, got {v!r}")
    return [(int(h), int(c))]


def section_dtypes(cfg: Dict[str, Any], key: str) -> List[str]:
    """``<key>.dtypes`` when set, else the top-level ``dtypes``."""
    sc = _section(cfg, key)
    if sc.get("dtypes") is not None:
        return _dtype_list(sc["dtypes"], f"{key}.dtypes")
    return _dtype_list(cfg.get("dtypes", ["float32"]), "dtypes")


def contender_limits(cfg: Dict[str, Any], key: str) -> Dict[str, Dict[str, Any]]:
    """``<key>.only`` validated: ``{contender: {"shapes": [...] | None,
    "dtypes": [...] | None, "graphs": [...] | None}}``."""
    sc = _section(cfg, key)
    _, known, baseline = SECTIONS[key]
    only = sc.get("only") or {}
    if not isinstance(only, dict):
        raise ValueError(f"{key}.only: expected a mapping contender -> {{shapes, dtypes, "
                         f"graphs}}, got {only!r}")
    out: Dict[str, Dict[str, Any]] = {}
    for c, lim in only.items():
        k = f"{key}.only.{c}"
        if c not in known:
            raise ValueError(f"{k}: unknown contender {c!r}; choose from {list(known)}")
        if c == baseline:
            raise ValueError(f"{k}: the baseline {baseline!r} runs in every case (speedups "
                             f"and the correctness yardstick need it); it cannot be limited")
        if not isinstance(lim, dict):
            raise ValueError(f"{k}: expected a mapping with keys {list(_ONLY_KEYS)}, "
                             f"got {lim!r}")
        bad = [x for x in lim if x not in _ONLY_KEYS]
        if bad:
            raise ValueError(f"{k}.{bad[0]}: unknown key; use {', '.join(_ONLY_KEYS)}")
        graphs = lim.get("graphs")
        if graphs is not None and (not isinstance(graphs, list)
                                   or not all(isinstance(g, str) for g in graphs)):
            raise ValueError(f"{k}.graphs: expected a list of graph names, got {graphs!r}")
        out[c] = {
            "shapes": None if lim.get("shapes") is None
            else _shape_list(lim["shapes"], f"{k}.shapes"),
            "dtypes": None if lim.get("dtypes") is None
            else _dtype_list(lim["dtypes"], f"{k}.dtypes"),
            "graphs": graphs,
        }
    return out


def _graph_key(spec: Dict[str, Any], i: Optional[int]) -> str:
    name = spec.get("name") or spec.get("kind")
    return f"graphs[{i}]" if name is None else f"graphs[{name}]"


def graph_limits(spec: Dict[str, Any], i: Optional[int] = None
                 ) -> Tuple[Optional[List[Shape]], Optional[List[str]]]:
    """A graph entry's own ``shapes`` / ``dtypes`` (``None``: no limit)."""
    k = _graph_key(spec, i)
    shapes = None if spec.get("shapes") is None else _shape_list(spec["shapes"],
                                                                 f"{k}.shapes")
    dtypes = None if spec.get("dtypes") is None else _dtype_list(spec["dtypes"],
                                                                 f"{k}.dtypes")
    return shapes, dtypes


def section_enabled(cfg: Dict[str, Any], key: str, graph: str) -> bool:
    sc = _section(cfg, key)
    if key == "layers":
        return bool(sc.get("enabled", True))
    graphs = sc.get("graphs")
    return bool(sc.get("enabled", False)) and (graphs is None or graph in graphs)


def section_plan(cfg: Dict[str, Any], key: str, spec: Dict[str, Any],
                 index: Optional[int] = None) -> List[Tuple[Shape, str, List[str]]]:
    """``[(shape, dtype, contenders), ...]`` that section ``key`` runs on the
    graph of ``spec``, in run order (shape, then dtype); empty when the
    section is off for that graph."""
    name = str(spec.get("name") or spec.get("kind"))
    shapes = section_shapes(cfg, key)
    dtypes = section_dtypes(cfg, key)
    limits = contender_limits(cfg, key)
    g_shapes, g_dtypes = graph_limits(spec, index)
    if not section_enabled(cfg, key, name):
        return []
    contenders = list(_section(cfg, key).get("contenders")
                      or SECTIONS[key][1][:2])
    plan = []
    for s in shapes:
        if g_shapes is not None and s not in g_shapes:
            continue
        for dt in dtypes:
            if g_dtypes is not None and dt not in g_dtypes:
                continue
            run = []
            for c in contenders:
                lim = limits.get(c)
                if lim is not None and ((lim["shapes"] is not None and s not in lim["shapes"])
                                        or (lim["dtypes"] is not None
                                            and dt not in lim["dtypes"])
                                        or (lim["graphs"] is not None
                                            and name not in lim["graphs"])):
                    continue
                run.append(c)
            plan.append((s, dt, run))
    return plan


def expand(cfg: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Every (section, graph, shape, dtype, case, contender) the layer and op
    sections of ``cfg`` will run, without building anything (``dfgnn bench
    --plan``); raises :class:`ValueError` naming the key of a bad entry."""
    out: List[Dict[str, Any]] = []
    graphs = cfg.get("graphs") or []
    if not isinstance(graphs, list):
        raise ValueError(f"graphs: expected a list of graph entries, got {graphs!r}")
    from .layers import LAYERS
    from .ops_bench import OPS
    for key, known in (("layers", tuple(LAYERS)), ("ops", OPS)):
        # validate both sections even when one is off
        section_shapes(cfg, key), section_dtypes(cfg, key), contender_limits(cfg, key)
        names = _section(cfg, key).get("names") or []
        if not isinstance(names, list):
            raise ValueError(f"{key}.names: expected a list, got {names!r}")
        bad = [n for n in names if n not in known]
        if bad:
            raise ValueError(f"{key}.names: unknown {key[:-1]}(s) {bad}; choose from "
                             f"{list(known)}")
    for i, spec in enumerate(graphs):
        if not isinstance(spec, dict):
            raise ValueError(f"graphs[{i}]: expected a mapping, got {spec!r}")
        gname = str(spec.get("name") or spec.get("kind"))
        for key, (section, _, _) in SECTIONS.items():
            names = _section(cfg, key).get("names") or []
            for shape, dt, conts in section_plan(cfg, key, spec, i):
                for case in names:
                    for c in conts:
                        out.append({"section": section, "graph": gname,
                                    "shape": shape_label(shape), "heads": shape[0],
                                    "channels": shape[1], "dtype": dt, "case": case,
                                    "contender": c})
    return out
