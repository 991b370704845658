"""The `torchtpu` command: `info`, `cache ...` (cache.py; `cache prewarm` is prewarm.py) and `inspect`
(torchtpu/inspect/cli.py). It drives every layer below it, so it sits on top of them."""
from __future__ import annotations

import argparse
import json


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
    _add_cache(sub)
    from torchtpu.inspect.cli import add_inspect_parser

    add_inspect_parser(sub)
    return parser


def _add_cache(sub) -> None:
    from torchtpu.cli import cache as commands

    cache = sub.add_parser("cache", help="the on-disk compilation cache (TORCHTPU_CACHE_DIR)",
                           description="Manage the on-disk compilation cache (TORCHTPU_CACHE_DIR).")
    csub = cache.add_subparsers(dest="cache_command", required=True)
    ls = csub.add_parser("ls", help="list entries: key prefix, graph, inputs, platform, size, hits, last used")
    ls.add_argument("--json", action="store_true", help="print JSON")
    ls.set_defaults(func=commands.ls)
    stats = csub.add_parser("stats", help="entries, bytes, hit/miss counts by tier and platform")
    stats.add_argument("--json", action="store_true", help="print JSON")
    stats.set_defaults(func=commands.stats)
    verify = csub.add_parser("verify", help="check every entry; remove and report bad ones")
    verify.add_argument("-v", "--verbose", action="store_true", help="also list the good entries")
    verify.set_defaults(func=commands.verify)
    clear = csub.add_parser("clear", help="remove entries (all, or those matching the filters)")
    clear.add_argument("--older-than", type=float, metavar="DAYS", help="only entries unused for DAYS days")
    clear.add_argument("--platform", help="only entries for this platform (cpu, gpu, tpu)")
    clear.set_defaults(func=commands.clear)
    explain = csub.add_parser("explain", help="the named parts of an entry's key and their hashes")
    explain.add_argument("key", help="a key or a unique prefix of one")
    explain.set_defaults(func=commands.explain)
    prewarm = csub.add_parser("prewarm", help="compile a model's example inputs into the cache",
                              description="TARGET is module:function returning (model, [input_tuple, ...]). "
                                          "Two passes, under torch.no_grad: each input set is compiled as "
                                          "torch.compile(model, backend='tpu') would compile it as a fresh "
                                          "process's first call; then all sets are called in order through "
                                          "one torch.compile in one process, as a server would, so the "
                                          "graphs Dynamo makes after a shape change (automatic dynamic) are "
                                          "cached too.")
    prewarm.add_argument("module_function", metavar="TARGET", help="module:function")
    prewarm.add_argument("--jobs", type=int, default=1,
                         help="parallel processes for the first-call pass (default 1); the in-order pass is one")
    prewarm.add_argument("--target", choices=("local", "tpu"), default="local",
                         help="local: this process's platform; tpu: deviceless TPU compile (needs libtpu)")
    prewarm.add_argument("--topology", help="TPU topology for --target tpu, e.g. v5e:2x2")
    prewarm.add_argument("--no-replay", dest="replay", action="store_false",
                         help="skip the in-order pass (only each set as a fresh process's first call)")
    prewarm.add_argument("--precompile", metavar="DIR",
                         help="also write a precompiled artifact per input set, DIR/set-N.tpu "
                              "(torchtpu.precompile.save), and DIR/manifest.json (index, input shapes, file); "
                              "not with --target tpu: save compiles for this process's platform and a loaded "
                              "artifact takes the loading process's executables, so write artifacts on the "
                              "host (platform) that will load them")
    prewarm.add_argument("--worker", help=argparse.SUPPRESS)
    prewarm.set_defaults(func=commands.prewarm)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    import torchtpu.compiler  # noqa: F401  (registers rules)

    return args.func(args)

