"""The inspector's text and HTML reports (the HTML is self-contained: inline CSS and SVG)."""
from __future__ import annotations

import html

from torchtpu.explain import frame_of


def text(summary: dict) -> str:
    t = summary["totals"]
    rate = "n/a" if t["cache_hit_rate"] is None else f"{t['cache_hit_rate']:.0%} ({t['cache_hits']}/{t['cache_hits'] + t['cache_misses']})"
    lines = [f"frames {t['frames']}   graphs {t['graphs']}   compiles {t['compiles']}   "
             f"recompiles {t['recompiles']}   seconds compiling {t['seconds_compiling']:.2f}   "
             f"cache hit rate {rate}" + (f"   eager frames {t['eager_frames']}" if t.get("eager_frames") else ""), ""]
    width = max([len(f["frame"]) for f in summary["frames"]] + [5])
    lines.append(f"{'frame':<{width}}  graphs  compiles  recompiles  buckets  seconds")
    for f in summary["frames"]:
        lines.append(f"{f['frame']:<{width}}  {f['graphs']:>6}  {f['compiles']:>8}  {f['recompiles']:>10}  "
                     f"{f['buckets']:>7}  {f['seconds']:>7.2f}")
    if summary["reasons"]:
        lines += ["", "recompiles by reason"]
        lines += [f"  {n:>4}  {reason}" for reason, n in summary["reasons"].items()]
    if summary["recompiles"]:
        lines += ["", "recompiles"]
        lines += [f"  [{r['compile_id']}] {r['frame']}: {r['explanation']}" for r in summary["recompiles"]]
    if summary.get("flushes"):
        lines += ["", "defer-mode flushes by reason", f"  {'reason':<22} flushes      ops  compiled  cached  hit  errors  "
                  "most frequent source"]
        for reason, f in summary["flushes"].items():
            lines.append(f"  {reason:<22} {f['flushes']:>7}  {f['ops']:>7}  {f['compile']:>8}  {f['cache']:>6}  "
                         f"{f['hit']:>3}  {f['errors']:>6}  {f['sources'][0] if f['sources'] else ''}")
    if summary.get("eager_frames"):
        lines += ["", "frames run eagerly (the next new size would have hit Dynamo's recompile limit)"]
        lines += [_eager_line(f) for f in summary["eager_frames"]]
    return "\n".join(lines) + "\n"


def _eager_line(f: dict) -> str:
    shapes = f["eager_inputs"]
    ran = (f"{len(shapes)} new input shape(s) ran eagerly since, e.g. {', '.join(shapes[0])}" if shapes
           else "no call has run eagerly yet")
    return (f"  [{f['compile_id']}] {f['frame']}: eager past {f['graphs']} graphs (recompile_limit "
            f"{f['limit']}); {ran}. Why: {f['explanation']}")


def html_report(summary: dict, events: list[dict]) -> str:
    e = html.escape
    rows = "".join(f"<tr><td>{e(f['frame'])}</td><td>{f['graphs']}</td><td>{f['compiles']}</td>"
                   f"<td>{f['recompiles']}</td><td>{f['buckets']}</td><td>{f['seconds']:.2f}</td></tr>"
                   for f in summary["frames"])
    recompiles = "".join(f"<li><code>{e(str(r['compile_id']))}</code> {e(r['frame'])}: {e(r['explanation'])}</li>"
                         for r in summary["recompiles"])
    eager = "".join(f"<li>{e(_eager_line(f).strip())}</li>" for f in summary.get("eager_frames", []))
    totals = " · ".join(f"{e(k.replace('_', ' '))}: {e(str(v))}" for k, v in summary["totals"].items())
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>torchtpu compile report</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:2px 8px;text-align:right}}td:first-child{{text-align:left}}</style>
</head><body>
<h1>torchtpu compile report</h1>
<p>{totals}</p>
<h2>Frames</h2>
<table><tr><th>frame</th><th>graphs</th><th>compiles</th><th>recompiles</th><th>buckets</th><th>seconds</th></tr>{rows}</table>
<h2>Timeline of compiles</h2>
{timeline_svg(events)}
<h2>Recompiles</h2>
<ul>{recompiles or "<li>none</li>"}</ul>
<h2>Frames run eagerly</h2>
<ul>{eager or "<li>none</li>"}</ul>
</body></html>
"""


def timeline_svg(events: list[dict], width: int = 900) -> str:
    """One row per frame (Dynamo + AOTAutograd tracing, grey) and per graph (XLA compiles, blue)."""
    bars = []  # (row label, start, end, colour, tooltip)
    for ev in events:
        if ev.get("kind") == "compile":
            seconds = (ev.get("lower_ms", 0) + ev.get("compile_ms", 0)) / 1e3
            bars.append((f"{ev.get('graph')}", ev["time"] - seconds, ev["time"], "#4a7fd0",
                         f"XLA {ev.get('graph')} {ev.get('signature', '')} {seconds:.2f}s"))
        elif ev.get("kind") == "dynamo" and ev.get("start"):
            label = f"frame {frame_of(ev.get('compile_id'))} {ev.get('co_name') or ''}"
            why = ev.get("recompile_reason") or "first compile"
            bars.append((label, ev["start"], ev["start"] + (ev.get("seconds") or 0), "#999999",
                         f"Dynamo {ev.get('compile_id')}: {why}"))
    rows = list(dict.fromkeys(b[0] for b in bars))
    height = 30 + 18 * max(len(rows), 1)
    if not bars:
        return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">'
                '<text x="10" y="20">no compiles</text></svg>')
    t0, t1 = min(b[1] for b in bars), max(b[2] for b in bars)
    scale = (width - 190) / max(t1 - t0, 1e-3)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">',
             f'<text x="180" y="12" font-size="10">0 s</text>'
             f'<text x="{width - 50}" y="12" font-size="10">{t1 - t0:.1f} s</text>']
    for i, label in enumerate(rows):
        parts.append(f'<text x="2" y="{30 + 18 * i + 11}" font-size="11">{html.escape(label[:28])}</text>')
    for label, a, b, colour, tip in bars:
        x, w = 180 + (a - t0) * scale, max((b - a) * scale, 1.5)
        parts.append(f'<rect x="{x:.1f}" y="{30 + 18 * rows.index(label)}" width="{w:.1f}" height="14" '
                     f'fill="{colour}"><title>{html.escape(tip)}</title></rect>')
    parts.append("</svg>")
    return "\n".join(parts)
