"""An exclusive lock on a file, between the processes of this machine and the threads of one."""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_GUARD = threading.Lock()
_THREAD_LOCKS: dict[str, threading.RLock] = {}
_DEPTH: dict[str, int] = {}


@contextmanager
def file_lock(path: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) for the block. Re-entrant within a
    process: a thread that holds it may take it again, and other threads wait as other processes do."""
    key = str(Path(path).resolve())
    with _GUARD:
        rlock = _THREAD_LOCKS.setdefault(key, threading.RLock())
    with rlock:
        depth = _DEPTH.get(key, 0)
        fd = None
        if depth == 0:
            fd = os.open(key, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
        _DEPTH[key] = depth + 1
        try:
            yield
        finally:
            _DEPTH[key] = depth
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
