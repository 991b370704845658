"""Where torchtpu keeps its files. Imports nothing of torchtpu, so any module can use it.

    user_cache_dir()   $XDG_CACHE_HOME/torchtpu, else ~/.cache/torchtpu
    default_root()     the compilation cache (and event log) directory: TORCHTPU_CACHE_DIR, else the above
    from_env(var, default)   a path variable that may say "off"
    untrusted(path)    why a file or directory whose contents this process would run is not safe to use
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


def untrusted(path: Path) -> str | None:
    """Why `path` must not be loaded from (its contents are code this process would run): it is
    owned by another user, or others can write to it; None when it is safe or does not exist yet.
    Raises OSError when it cannot be examined."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    if st.st_uid not in (os.getuid(), 0):
        return f"{path} is owned by another user (uid {st.st_uid})"
    if st.st_mode & 0o022:
        return f"{path} is writable by other users (mode {st.st_mode & 0o777:o})"
    return None
