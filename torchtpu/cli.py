"""The `torchtpu` command."""
from __future__ import annotations

import argparse
import json
import sys


def _info(args) -> int:
    import jax
    import torch

    from torchtpu.compiler import registry
    from torchtpu.runtime.platform import PLATFORMS, available, default_platform

    info = {
        "torchtpu": __import__("torchtpu").__version__,
        "torch": torch.__version__,
        "jax": jax.__version__,
        "platform": default_platform(),
        "available": [p for p in PLATFORMS if available(p)],
        "lowering_rules": len(registry.registered()),
    }
    if args.json:
        print(json.dumps(info, indent=1))
    else:
        for k, v in info.items():
            print(f"{k:15} {v}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="torchtpu", description="torchtpu: the torch.compile backend 'tpu'.")
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="versions, the platform this process would use, rule count")
    info.add_argument("--json", action="store_true", help="print JSON")
    info.set_defaults(func=_info)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    import torchtpu.compiler  # noqa: F401  (registers rules)

    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
