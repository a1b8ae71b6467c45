"""The on-disk cache of measurements: one JSON file per (layer signature,
machine), so that a second ``convert(..., 'auto')`` of a network times nothing.

Files are written to a temporary name in the same folder and renamed over the
old one (atomic on POSIX and Windows), so concurrent writers never leave a
torn file: the last rename wins, and each writer's file is whole. A file that
cannot be read or parsed is ignored with a warning (and rewritten by the next
measurement), never an error.

The folder is ``$AI3_CACHE_DIR`` when set, else the platform's user cache
folder (``$XDG_CACHE_HOME/ai3`` or ``~/.cache/ai3`` on Linux,
``~/Library/Caches/ai3`` on macOS, ``%LOCALAPPDATA%\\ai3\\Cache`` on Windows).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

#: Bumped when the entries' format changes; older files are then not read.
FORMAT = 1


def cache_dir() -> Path:
    """The folder ai3 keeps its measurements in (see the module doc)."""
    env = os.environ.get("AI3_CACHE_DIR")
    if env:
        return Path(env)
    home = Path.home()
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA", home / "AppData" / "Local"))
        return base / "ai3" / "Cache"
    if sys.platform == "darwin":
        return home / "Library" / "Caches" / "ai3"
    return Path(os.environ.get("XDG_CACHE_HOME") or home / ".cache") / "ai3"


def _path(key: str) -> Path:
    return cache_dir() / f"measurements-v{FORMAT}" / key[:2] / f"{key}.json"


def load(key: str) -> dict[str, Any] | None:
    """The entry stored under ``key``, or ``None`` (missing, unreadable or corrupt)."""
    path = _path(key)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as e:
        warnings.warn(f"ai3: cannot read the cache file {path}: {e}", stacklevel=2)
        return None
    try:
        entry = json.loads(text)
        if not isinstance(entry, dict) or not isinstance(entry.get("algorithms"), dict):
            raise ValueError("not a measurement entry")
    except ValueError as e:
        warnings.warn(
            f"ai3: ignoring the corrupt cache file {path} ({e}); it will be measured again",
            stacklevel=2,
        )
        return None
    return entry


def store(key: str, entry: dict[str, Any]) -> None:
    """Writes ``entry`` under ``key`` atomically; a failure to write only warns."""
    path = _path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(entry, f, sort_keys=True)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as e:
        warnings.warn(f"ai3: cannot write the cache file {path}: {e}", stacklevel=2)
