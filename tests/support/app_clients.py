"""What the example apps' processes share (orm_app_process.py, django_app_process.py, run as scripts
with this directory on their path): their arguments, one JSON line per operation, and their writer
and reader threads.

    KEYS(comma-separated) STOP CAPTION_TAG NAME WRITERS READERS
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Args:
    keys: list[int]
    stop: str  # the file whose existence ends the run
    tag: str  # in every caption written
    name: str  # the clients' prefix
    writers: int
    readers: int


def args() -> Args:
    keys, stop, tag, name, writers, readers = sys.argv[1:7]
    return Args([int(k) for k in keys.split(",")], stop, tag, name, int(writers), int(readers))


def json_lines() -> Callable[..., None]:
    """``emit(**doc)``: one JSON line on stdout, whole, whichever thread prints it."""
    lock = threading.Lock()

    def emit(**doc) -> None:
        with lock:
            print(json.dumps(doc), flush=True)

    return emit


def run_clients(run: Args, loop: Callable[[str, bool], None]) -> None:
    """``loop(client, write)`` in a thread per writer and per reader, until each returns."""
    threads = [
        threading.Thread(target=loop, args=(f"{run.name}-w{i}", True)) for i in range(run.writers)
    ] + [
        threading.Thread(target=loop, args=(f"{run.name}-r{i}", False)) for i in range(run.readers)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
