"""`torchtpu inspect [LOG]`: the compile report of an event log."""
from __future__ import annotations

import json


def add_inspect_parser(subparsers) -> None:
    p = subparsers.add_parser("inspect", help="explain compiles and recompiles from the event log",
                              description="Summarise an event log (default: TORCHTPU_EVENT_LOG, else "
                                          "events.jsonl in the cache directory) and explain each recompile.")
    p.add_argument("log", nargs="?", metavar="LOG", help="a JSONL event log")
    p.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report with a timeline")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from torchtpu import events
    from torchtpu.inspect import render, summary

    path = args.log or events.log_path()
    if path is None:
        print("torchtpu inspect: the event log is off (TORCHTPU_EVENT_LOG=off); pass a LOG path")
        return 2
    try:
        evs = events.read_log(path)
    except OSError as exc:
        print(f"torchtpu inspect: cannot read {path}: {exc}")
        return 2
    s = summary.summarize(evs)
    if args.html:
        with open(args.html, "w", encoding="utf-8") as f:
            f.write(render.html_report(s, evs))
    print(json.dumps(s, indent=1, default=str) if args.json else render.text(s), end="" if not args.json else "\n")
    return 0
