"""The recompilation inspector: what was compiled, why it compiled again, and what to change.

    import torchtpu.inspect
    torchtpu.inspect.events()            # this process's compile events (list of dicts)
    print(torchtpu.inspect.report())     # the summary table and an explanation per recompile
"""
from __future__ import annotations

from torchtpu import events as _events
from torchtpu.explain import explain
from torchtpu.inspect.render import html_report, text
from torchtpu.inspect.summary import summarize


def events(log=None) -> list[dict]:
    """This process's events, or those of a JSONL event log at `log`."""
    return _events.read_log(log) if log is not None else _events.events()


def report(log=None, html: str | None = None) -> str:
    """The text report of this process (or of the log at `log`); also writes HTML to `html` if given."""
    evs = events(log)
    summary = summarize(evs)
    if html is not None:
        with open(html, "w", encoding="utf-8") as f:
            f.write(html_report(summary, evs))
    return text(summary)


__all__ = ["events", "report", "summarize", "explain"]
