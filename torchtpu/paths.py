"""Where torchtpu keeps its files. Imports nothing of torchtpu, so any module can use it.

    user_cache_dir()   $XDG_CACHE_HOME/torchtpu, else ~/.cache/torchtpu
    default_root()     the compilation cache (and event log) directory: TORCHTPU_CACHE_DIR, else the above
    from_env(var, default)   a path variable that may say "off"
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable


def user_cache_dir() -> Path:
    """$XDG_CACHE_HOME/torchtpu, else ~/.cache/torchtpu."""
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(xdg) if xdg else Path.home() / ".cache") / "torchtpu"


def from_env(var: str, default: Callable[[], Path | None]) -> Path | None:
    """The path in environment variable `var`; None when it says off (off, 0, none, false);
    default() when it is unset or empty."""
    asked = os.environ.get(var, "").strip()
    if asked.lower() in ("off", "0", "none", "false"):
        return None
    return Path(asked).expanduser() if asked else default()


def default_root() -> Path | None:
    """TORCHTPU_CACHE_DIR, else user_cache_dir(); None when "off"."""
    return from_env("TORCHTPU_CACHE_DIR", user_cache_dir)
