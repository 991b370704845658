"""The compile-event log and the recompilation inspector."""
from __future__ import annotations

import argparse
import html.parser
import json
import os
import shutil
import subprocess
import warnings
import xml.etree.ElementTree as ET

import pytest
import torch

import torchtpu
import torchtpu.inspect
from torchtpu import events
from torchtpu.inspect.cli import add_inspect_parser
from torchtpu.explain import category, explain

from helpers import compile_tpu


def _dynamo(reason=None, fail=None, cid="0/1"):
    return {"kind": "dynamo", "compile_id": cid, "recompile_reason": reason, "fail_reason": fail}


def test_explanations_name_the_change_and_a_fix():
    off = [{"kind": "bucketing", "compile_id": "0/1", "status": "exact", "reason": "bucketing is off (option)"}]
    size = explain(_dynamo("0/0: tensor 'x' size mismatch at index 1. expected 128, actual 130"), off)
    assert size.startswith("input `x` dim 1 changed 128 → 130: bucketing is off for this frame")
    assert "mark the dim dynamic" in size
    dtype = explain(_dynamo("0/1: tensor 'x' dtype mismatch. expected Float, actual BFloat16"), [])
    assert dtype.startswith("dtype of `x` changed float32 → bfloat16")
    intarg = explain(_dynamo("0/2: n == 3        # def f(x, n)\nUser stack trace: ..."), [])
    assert intarg.startswith("a Python int argument `n` changed from 3") and "tensor" in intarg
    limit = explain(_dynamo(fail="Dynamo recompile limit exceeded ..."), [])
    assert limit.startswith("recompile limit reached: this frame now runs eagerly")
    one = explain(_dynamo("tensor 'x' size mismatch at index 0. expected 2, actual 1"), [])
    assert "specializes size 1" in one


def test_explanations_of_dynamos_size_guards_as_hf_mamba_makes_them():
    """The reasons below are Dynamo's own, from transformers' Mamba called with input_ids=... ."""
    kwarg = _dynamo("0/0: tensor 'kwargs['input_ids']' size mismatch at index 0. expected 5, actual 6")
    assert category(kwarg) == "size changed"
    assert explain(kwarg, []).startswith("input `input_ids` dim 0 changed 5 → 6")
    branch = _dynamo("0/1: ((kwargs['input_ids'].size()[1] // 32) % 2) == 0  # _, all_states = associative_scan("
                     "  # transformers/models/mamba/modeling_mamba.py:237 in mamba_selective_scan "
                     "(_dynamo/variables/tensor.py:2606 in evaluate_expr)")
    assert category(branch) == "size-dependent branch"
    assert explain(branch, []).startswith(
        "this frame's code depends on the value of dim 1 of `input_ids`: it tests "
        "`((input_ids.size(1) // 32) % 2) == 0` at `_, all_states = associative_scan(` "
        "(transformers/models/mamba/modeling_mamba.py:237 in mamba_selective_scan), and each outcome is a new graph")
    assert "mark_dynamic cannot help" in explain(branch, [])
    both = _dynamo("0/6: ((-512)*kwargs['input_ids'].size()[0]) + 512*kwargs['input_ids'].size()[0]"
                   "*(kwargs['input_ids'].size()[1] // 64) < 2  # return a  # f.py:234 in combine_fn")
    assert "value of dims 0, 1 of `input_ids`" in explain(both, [])
    assert category(_dynamo("0/1: 2 <= L['x'].size()[0]")) == "size left its dynamic range"
    hard = {**_dynamo(fail="Hard failure due to fullgraph=True"), "fail_type": "FailOnRecompileLimitHit"}
    assert category(hard) == "recompile limit reached"
    assert explain(hard, []).startswith("recompile limit reached: Dynamo raised FailOnRecompileLimitHit")


@pytest.fixture
def log(tmp_path, monkeypatch):
    events.sync_dynamo()  # earlier tests' Dynamo compiles go to their own log, not this one
    path = tmp_path / "events.jsonl"
    monkeypatch.setenv("TORCHTPU_EVENT_LOG", str(path))
    return path


def _inspect_json(log, capsys) -> dict:
    """The summary exactly as `torchtpu inspect LOG --json` prints it."""
    parser = argparse.ArgumentParser()
    add_inspect_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["inspect", str(log), "--json"])
    assert args.func(args) == 0
    return json.loads(capsys.readouterr().out)


def _record_session(scale: float = 1.0):
    """One frame that recompiles for a size (bucketing off), a dtype and an int. A new `scale`
    is a new graph, so its XLA compiles are not served from the in-process cache."""
    def f(x, n):
        return (x * n * scale).sum(-1)

    c = compile_tpu(f, fullgraph=True, options={"bucketing": "off"})
    c(torch.randn(2, 128), 3)
    c(torch.randn(2, 130), 3)
    c(torch.randn(2, 130, dtype=torch.bfloat16), 3)
    c(torch.randn(2, 130), 4)
    events.sync_dynamo()


def test_the_in_process_record_keeps_the_newest_events(monkeypatch):
    """A long defer-mode loop records a flush event per flush: the process keeps the newest
    TORCHTPU_EVENTS_KEEP of them and counts the rest."""
    import collections

    monkeypatch.setenv("TORCHTPU_EVENT_LOG", "off")
    monkeypatch.setattr(events, "_events", collections.deque(maxlen=3))
    monkeypatch.setattr(events, "_dropped", 0)
    for i in range(5):
        events.record("flush", reason="item", ops=i)
    assert [e["ops"] for e in events.events()] == [2, 3, 4]
    assert events.dropped() == 2
    events.clear()
    assert events.events() == [] and events.dropped() == 0


def test_the_log_is_rotated_past_its_size_limit(tmp_path, monkeypatch):
    path = tmp_path / "events.jsonl"
    monkeypatch.setenv("TORCHTPU_EVENT_LOG", str(path))
    monkeypatch.setenv("TORCHTPU_EVENT_LOG_MB", str(8192 / 2**20))  # 8 KiB
    for i in range(200):  # ≈ 25 KiB of events
        events.record("flush", reason="item", ops=i, source="x" * 60)
    older, newer = events.read_log(tmp_path / "events.jsonl.1"), events.read_log(path)
    assert path.stat().st_size <= 8192 and (tmp_path / "events.jsonl.1").stat().st_size <= 8192 + 300
    assert newer[-1]["ops"] == 199 and older and older[-1]["ops"] + 1 == newer[0]["ops"]  # nothing lost between them
    assert not (tmp_path / "events.jsonl.2").exists()


def test_the_open_log_follows_a_rotation_by_another_process(tmp_path, monkeypatch):
    """The log stays open between events; a file renamed away under it (another process rotated
    it) is not written to again: the next event starts a new file at the path."""
    path = tmp_path / "events.jsonl"
    monkeypatch.setenv("TORCHTPU_EVENT_LOG", str(path))
    events.record("flush", reason="item", ops=1)
    os.replace(path, tmp_path / "events.jsonl.1")  # as another process's rotation does
    events.record("flush", reason="item", ops=2)
    assert [e["ops"] for e in events.read_log(tmp_path / "events.jsonl.1")] == [1]
    assert [e["ops"] for e in events.read_log(path)] == [2]
    path.unlink()  # removed, not rotated: the next event makes it again
    events.record("flush", reason="item", ops=3)
    assert [e["ops"] for e in events.read_log(path)] == [3]


def test_report_from_a_recorded_log(log, capsys):
    _record_session()
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    kinds = {e["kind"] for e in lines}
    assert {"graph", "bucketing", "compile", "dynamo"} <= kinds
    text = torchtpu.inspect.report(log=str(log))
    assert "recompiles by reason" in text
    assert "size changed" in text and "dtype changed" in text and "Python int changed" in text
    assert "input `x` dim 1 changed 128 → 130: bucketing is off for this frame" in text
    assert "dtype of `x` changed float32 → bfloat16" in text
    header = next(line for line in text.splitlines() if line.startswith("frames "))
    assert "recompiles 3" in header

    parser = argparse.ArgumentParser()
    add_inspect_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["inspect", str(log)])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert out == text


def test_the_log_has_each_recompile_as_it_ends(log, capsys):
    """Dynamo records a frame after its backend returns; `torchtpu inspect` reading the log of a
    live process must not wait for its next compile (or its exit) to see the last one."""
    def f(x, n):
        return (x * n).sum(-1) + 0.25

    c = compile_tpu(f, fullgraph=False, options={"bucketing": "off"})
    x = torch.randn(2, 8)
    with torch._dynamo.config.patch(recompile_limit=3):
        c(x, 3)
        c(x, 4)
        c(x.to(torch.bfloat16), 4)
        c(x.to(torch.float16), 4)  # over the limit: Dynamo runs it eagerly, no backend call follows

    summary = _inspect_json(log, capsys)
    recompiles = summary["recompiles"]
    assert [r["category"] for r in recompiles] == ["Python int changed", "dtype changed", "recompile limit reached"]
    assert recompiles[0]["reason"].startswith("0/0: n == 3")
    assert recompiles[1]["reason"] == "0/1: tensor 'x' dtype mismatch. expected Float, actual BFloat16"
    assert recompiles[2]["reason"] == "0/2: tensor 'x' dtype mismatch. expected BFloat16, actual Half"
    assert summary["totals"]["recompiles"] == 3


def test_html_report_is_well_formed_with_an_svg_timeline(log, tmp_path):
    _record_session()
    page = tmp_path / "report.html"
    torchtpu.inspect.report(log=str(log), html=str(page))
    doc = page.read_text()

    class Checker(html.parser.HTMLParser):
        def __init__(self):
            super().__init__()
            self.stack, self.errors = [], []

        def handle_starttag(self, tag, attrs):
            if tag not in ("meta", "br", "line", "rect"):
                self.stack.append(tag)

        def handle_endtag(self, tag):
            if tag in ("line", "rect"):
                return
            if not self.stack or self.stack.pop() != tag:
                self.errors.append(tag)

    checker = Checker()
    checker.feed(doc)
    assert not checker.errors and checker.stack == []
    svg = doc[doc.index("<svg"):doc.index("</svg>") + 6]
    root = ET.fromstring(svg)  # the SVG alone is well-formed XML
    assert len(root.findall("{http://www.w3.org/2000/svg}rect")) >= 4  # a bar per Dynamo compile (+ XLA compiles)
    assert "input `x` dim 1 changed 128 → 130" in doc


def test_warns_once_when_a_frame_recompiles_too_often(log, monkeypatch):
    monkeypatch.setenv("TORCHTPU_RECOMPILE_WARN", "2")
    c = compile_tpu(lambda x: x + 1, options={"bucketing": "off"}, dynamic=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(2, 8):
            c(torch.randn(n))
        events.sync_dynamo()
    mine = [w for w in caught if "recompiled" in str(w.message)]
    assert len(mine) == 1
    assert "changed" in str(mine[0].message)


class _LengthLoop(torch.nn.Module):
    """Specializes on its input's length: a Python loop over dim 1, so each length is a new graph."""

    def forward(self, x):
        y = x[:, :1]
        for i in range(x.shape[1]):
            y = y * 0.5 + x[:, i:i + 1]
        return y


def test_past_the_recompile_limit_a_size_specialized_frame_runs_eagerly(log, capsys):
    """fullgraph=True and more lengths than Dynamo's recompile_limit: no FailOnRecompileLimitHit;
    `limit` graphs, then new lengths run eagerly (counted, warned once, explained by the inspector)
    while lengths that have a graph keep it."""
    limit = torch._dynamo.config.recompile_limit
    model = _LengthLoop()
    compiled = compile_tpu(model)
    new = list(range(2, limit + 6))  # limit + 4 lengths: the last 4 come after the limit
    torchtpu.reset_stats()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in new + [3, limit + 4]:  # then one length with a graph, one that ran eagerly
            x = torch.randn(2, n)
            torch.testing.assert_close(compiled(x), model(x))
    stats = torchtpu.stats()
    assert stats["dynamo_graphs"] == limit and stats["eager_frames"] == 1
    assert stats["eager_calls"] == 5  # the 4 lengths past the limit, and limit + 4 again
    mine = [str(w.message) for w in caught if "runs eagerly" in str(w.message)]
    assert len(mine) == 1 and f"compiled {limit} graphs" in mine[0]

    summary = _inspect_json(log, capsys)
    assert summary["totals"]["eager_frames"] == 1 and summary["totals"]["recompiles"] == limit - 1
    assert {r["category"] for r in summary["recompiles"]} == {"size changed"}
    assert summary["recompiles"][-1]["explanation"].startswith(
        f"this frame's code depends on the value of dim 1 of `x` ({limit} → {limit + 1}): each length is a new graph")
    [eager] = summary["eager_frames"]
    assert (eager["graphs"], eager["limit"], eager["compile_id"]) == (limit, limit, f"0/{limit - 1}")
    assert "mark_dynamic cannot help" in eager["explanation"]
    assert eager["eager_inputs"] == [[f"x: float32[2,{n}]"] for n in new[limit:]]
    assert "frames run eagerly" in torchtpu.inspect.report(log=str(log))


def test_the_recompile_limit_still_fails_when_asked_or_when_not_only_sizes_changed():
    """fail_on_recompile_limit_hit=True is the user's request for the error; a frame that also
    recompiled for a dtype is not a size specialization, so Dynamo's limit stays as it is."""
    from torch._dynamo.exc import FailOnRecompileLimitHit

    model = _LengthLoop()
    with torch._dynamo.config.patch(recompile_limit=2, fail_on_recompile_limit_hit=True):
        compiled = compile_tpu(model)
        compiled(torch.randn(2, 2))
        compiled(torch.randn(2, 3))
        with pytest.raises(FailOnRecompileLimitHit):
            compiled(torch.randn(2, 4))
    with torch._dynamo.config.patch(recompile_limit=3):
        compiled = compile_tpu(model)
        compiled(torch.randn(2, 2))
        compiled(torch.randn(2, 2, dtype=torch.float64))
        compiled(torch.randn(2, 3, dtype=torch.float64))
        with pytest.raises(FailOnRecompileLimitHit):
            compiled(torch.randn(2, 4, dtype=torch.float64))


def _chromium() -> str | None:
    return next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)


@pytest.mark.skipif(_chromium() is None,
                    reason="no Chromium: `make test` installs Debian's chromium where apt-get can")
def test_html_report_renders_in_headless_chromium(log, tmp_path):
    from PIL import Image

    _record_session(scale=0.5)
    page = tmp_path / "report.html"
    torchtpu.inspect.report(log=str(log), html=str(page))
    # The flags keep a closed network quiet: no background fetches, no sync, a fresh profile.
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0"]
    dom = subprocess.run([_chromium(), *flags, "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=180)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert [line for line in dom.stderr.splitlines() if "CONSOLE" in line] == []  # no console messages
    assert dom.stdout.count("<rect") >= 4 and "torchtpu compile report" in dom.stdout

    shot = tmp_path / "report.png"
    subprocess.run([_chromium(), *flags, f"--screenshot={shot}", "--window-size=1000,1400", page.as_uri()],
                   capture_output=True, text=True, timeout=180, check=True)
    pixels = list(Image.open(shot).convert("RGB").getdata())
    xla_blue, dynamo_grey = (0x4A, 0x7F, 0xD0), (0x99, 0x99, 0x99)
    assert pixels.count(xla_blue) > 100 and pixels.count(dynamo_grey) > 100  # the timeline's bars were drawn
