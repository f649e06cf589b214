"""``dfgnn train CONFIG.yaml [key=value ...]`` (also ``python -m pyg_dfgnn train``)."""
from __future__ import annotations

import os
import sys
from typing import List, Optional

USAGE = """\
usage: dfgnn train CONFIG.yaml [key=value ...] [--overwrite] [--print-config] [--schema]
                   [--dry-run]

Train an attention GNN described by a YAML config. Overrides use dotted keys
and YAML scalars, e.g.:

  dfgnn train configs/pattern_gat_quick.yaml backend=pyg model.heads=4 epochs=2 \\
      out_dir=runs/try

Multi-GPU (DistributedDataParallel):  torchrun --nproc-per-node=4 -m pyg_dfgnn train X.yaml

Each run writes to out_dir (default runs/<name>).  A directory that already
holds a run (results.json or checkpoint_last.pt) is not overwritten: pass
resume=true to continue it, another out_dir=..., or --overwrite to replace it.

options:
  --overwrite      replace the run found in out_dir (its results, checkpoints, log)
  --print-config   print the resolved config (after overrides) and exit
  --dry-run        estimate the peak memory of a step from the graph and model sizes,
                   check it against the device's free memory and exit (2 if it would
                   not fit); nothing is trained or written
  --schema         list every config key with type, default and allowed values
  -h, --help       this message
Docs: docs/TRAINING.md
"""


#: files of a run in out_dir; --overwrite removes them before training
RUN_FILES = ("results.json", "checkpoint_last.pt", "checkpoint_best.pt", "train.log",
             "config.yaml")


def _err(msg: str) -> None:
    print(f"dfgnn train: {msg}", file=sys.stderr)


def _option_hint(argv: List[str], i: int) -> str:
    """``--epochs 2`` / ``--epochs=2`` -> a hint at the ``epochs=2`` form."""
    key, _, value = argv[i][2:].partition("=")
    if not key:
        return ""
    if not value and i + 1 < len(argv) and not argv[i + 1].startswith("-") \
            and "=" not in argv[i + 1]:
        value = argv[i + 1]
    return (f" (config values are set as key=value, without dashes: "
            f"{key.replace('-', '_')}={value or '...'})")


def _existing_run(out_dir: str) -> Optional[str]:
    """What run ``out_dir`` already holds: ``'finished'``, ``'unfinished'`` or ``None``."""
    if os.path.isfile(os.path.join(out_dir, "results.json")):
        return "finished"
    if os.path.isfile(os.path.join(out_dir, "checkpoint_last.pt")):
        return "unfinished"
    return None


def _is_rank0() -> bool:
    return os.environ.get("RANK", "0") == "0"


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``dfgnn train``; returns the exit status (130 on Ctrl-C)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _main(argv)
    except KeyboardInterrupt:  # while importing / loading the config
        _err("interrupted before training started")
        return 130


def _main(argv: List[str]) -> int:
    from .config import ConfigError, config_to_dict, describe_schema, load_config

    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    if "--schema" in argv:
        print("\n".join(describe_schema()))
        return 0
    print_only = "--print-config" in argv
    overwrite = "--overwrite" in argv
    dry = "--dry-run" in argv
    argv = [a for a in argv if a not in ("--print-config", "--overwrite", "--dry-run")]
    unknown = [i for i, a in enumerate(argv) if a.startswith("--")]
    if unknown:
        i = unknown[0]
        _err(f"unknown option {argv[i].partition('=')[0]}{_option_hint(argv, i)}\n\n"
             f"{USAGE}")
        return 2
    path, overrides = (argv[0], argv[1:]) if "=" not in argv[0] else (None, argv)
    if path is None:
        _err("the first argument must be a YAML config file\n\n" + USAGE)
        return 2
    try:
        cfg = load_config(path, overrides)
    except ConfigError as e:
        _err(f"config error: {e}")
        return 2
    if print_only:
        import yaml
        print(yaml.safe_dump(config_to_dict(cfg), sort_keys=False), end="")
        return 0
    if dry:
        return _dry_run(cfg)

    out_dir = cfg.resolved_out_dir()
    if cfg.resume in (None, False):
        found = _existing_run(out_dir)
        if found and not overwrite:
            _err(f"config error: out_dir: {out_dir} already holds a {found} run; pass "
                 f"resume=true to continue it, another out_dir=..., or --overwrite to "
                 f"replace it")
            return 2
        if _is_rank0():  # a fresh run: no files of an earlier run (e.g. its train.log)
            for name in RUN_FILES:
                p = os.path.join(out_dir, name)
                if os.path.isfile(p):
                    os.remove(p)

    from ..data.datasets import DataError
    from .models import BackendError
    from .trainer import TrainingError, train
    try:
        train(cfg)
    except ConfigError as e:  # found at start: device, out_dir, resume vs checkpoint config
        print(f"dfgnn train: config error: {e}", file=sys.stderr)
        return 2
    except (DataError, BackendError, TrainingError) as e:
        _err(f"error: {e}")
        return 1
    except KeyboardInterrupt:
        if not _is_rank0():
            return 130
        ckpt = os.path.join(out_dir, "checkpoint_last.pt")
        if cfg.checkpoint.enabled and os.path.isfile(ckpt):
            _err(f"interrupted; continue from {ckpt} with the same command plus "
                 f"resume=true")
        else:
            _err("interrupted before the first checkpoint was written; nothing to "
                 "resume, run the command again to start over")
        return 130
    return 0


def _dry_run(cfg) -> int:
    """``--dry-run``: the memory estimate; 0 if it fits, 2 if not, 1 on a data error."""
    from ..data.datasets import DataError
    from .config import ConfigError
    from .memory import dry_run
    from .models import BackendError
    try:
        res = dry_run(cfg)
    except ConfigError as e:
        _err(f"config error: {e}")
        return 2
    except (DataError, BackendError, RuntimeError) as e:
        _err(f"error: {e}")
        return 1
    if not res["fits"]:
        _err(f"config error: memory_check: {res['message']}")
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
