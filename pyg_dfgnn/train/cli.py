"""``dfgnn train CONFIG.yaml [key=value ...]`` (also ``python -m pyg_dfgnn train``)."""
from __future__ import annotations

import sys
from typing import List, Optional

USAGE = """\
usage: dfgnn train CONFIG.yaml [key=value ...] [--print-config] [--schema]

Train an attention GNN described by a YAML config. Overrides use dotted keys
and YAML scalars, e.g.:

  dfgnn train configs/pattern_gat_quick.yaml backend=pyg model.heads=4 epochs=2 \\
      out_dir=runs/try

Multi-GPU (DistributedDataParallel):  torchrun --nproc-per-node=4 -m pyg_dfgnn train X.yaml

options:
  --print-config   print the resolved config (after overrides) and exit
  --schema         list every config key with type, default and allowed values
  -h, --help       this message
Docs: docs/TRAINING.md
"""


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from .config import ConfigError, config_to_dict, describe_schema, load_config

    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    if "--schema" in argv:
        print("\n".join(describe_schema()))
        return 0
    print_only = "--print-config" in argv
    argv = [a for a in argv if a != "--print-config"]
    unknown = [a for a in argv if a.startswith("--")]
    if unknown:
        print(f"dfgnn train: unknown option {unknown[0]}\n\n{USAGE}", file=sys.stderr)
        return 2
    path, overrides = (argv[0], argv[1:]) if "=" not in argv[0] else (None, argv)
    if path is None:
        print("dfgnn train: the first argument must be a YAML config file\n\n" + USAGE,
              file=sys.stderr)
        return 2
    try:
        cfg = load_config(path, overrides)
    except ConfigError as e:
        print(f"dfgnn train: config error: {e}", file=sys.stderr)
        return 2
    if print_only:
        import yaml
        print(yaml.safe_dump(config_to_dict(cfg), sort_keys=False), end="")
        return 0

    from ..data.datasets import DataError
    from .models import BackendError
    from .trainer import TrainingError, train
    try:
        train(cfg)
    except ConfigError as e:  # found at start: device, out_dir, resume vs checkpoint config
        print(f"dfgnn train: config error: {e}", file=sys.stderr)
        return 2
    except (DataError, BackendError, TrainingError) as e:
        print(f"dfgnn train: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("dfgnn train: interrupted (resume with resume=true)", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
