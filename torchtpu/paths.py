"""Where torchtpu keeps its files. Imports nothing of torchtpu, so any module can use it.

    user_cache_dir()   $XDG_CACHE_HOME/torchtpu, else ~/.cache/torchtpu
    default_root()     the compilation cache (and event log) directory: TORCHTPU_CACHE_DIR, else the above
"""
from __future__ import annotations

import os
from pathlib import Path


def user_cache_dir() -> Path:
    """$XDG_CACHE_HOME/torchtpu, else ~/.cache/torchtpu."""
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(xdg) if xdg else Path.home() / ".cache") / "torchtpu"


def default_root() -> Path | None:
    """TORCHTPU_CACHE_DIR, else user_cache_dir(); None when "off"."""
    asked = os.environ.get("TORCHTPU_CACHE_DIR", "").strip()
    if asked.lower() in ("off", "0", "none", "false"):
        return None
    if asked:
        return Path(asked).expanduser()
    return user_cache_dir()
