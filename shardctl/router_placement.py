"""Where the Router finds each shard: its topology file, and the redirects that moved shards' old hosts
recorded, followed while this app server's copy of the file is stale."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from .model.dsn import mask
from .model.topology import Host, Topology
from .router_pool import log


class Placement:
    """The topology a Router routes by, reloaded when its file changes, plus the redirects it follows."""

    def __init__(self, topology: Topology, *, move_wait: float = 10.0, allow_inline_password: bool = False):
        self.topology = topology
        self.move_wait = move_wait  # how long to wait for the topology file to show a move's cutover
        self.allow_inline_password = allow_inline_password
        self.redirects = Redirects()  # shards routed by their old host's redirect (stale topology file)
        self._reload_lock = threading.Lock()
        self._file_stamp: tuple[int, int, int] | None = None  # the file as last parsed by reload()

    def locate(self, shard: int) -> Host:
        """The host serving ``shard``: a redirect followed, else the topology's owner."""
        return self.redirects.host(shard) or self.topology.host_of(shard)

    def reload(self) -> tuple[Topology, set[str]]:
        """Read the file again when it changed: (the topology, names of hosts that left or changed)."""
        if self.topology.path is None:
            return self.topology, set()
        # Many threads meet a moved shard at once, and an app server's file may never change: parse it
        # only when it did (a parse holds the GIL for every thread, writes to other shards included).
        with self._reload_lock:
            stamp = _file_stamp(self.topology.path)
            if stamp is not None and stamp == self._file_stamp:
                return self.topology, set()
            fresh = Topology.load(self.topology.path, allow_inline_password=self.allow_inline_password)
            self._file_stamp = stamp
            after = {h.name: (h.dsn, h.password_env, h.standby, h.pooler) for h in fresh.hosts}
            before = {h.name: (h.dsn, h.password_env, h.standby, h.pooler) for h in self.topology.hosts}
            self.topology = fresh
            changed = {name for name in before if after.get(name) != before[name]}
            changed |= self.redirects.reconcile(fresh)
        return fresh, changed

    def follow(self, shard: int, old: Host, moved: bool, *, reload: Callable[[], object],
               ask: Callable[[], tuple[dict | None, bool]]) -> bool:
        """True when ``shard`` (whose statement failed on ``old``) turned out to have moved and its new
        host is known: the reloaded topology names it, or ``old`` recorded a redirect (``ask()``: the
        redirect and whether ``old`` records the shard moved out), which is then followed until the
        file catches up. Without either, waits up to ``move_wait`` seconds for the file to say so."""
        deadline = time.monotonic() + self.move_wait
        asked = False
        while True:
            reload()
            new = self.locate(shard)
            if (new.name, new.dsn) != (old.name, old.dsn):
                return True
            if not asked:  # the file does not know (yet): ask the host the statement failed on
                asked = True
                redirect, moved_out = ask()
                if redirect is not None and redirect["host"] != old.name:
                    self.redirects.follow(shard, redirect, self.topology, old)
                    return True
                # A missing table may be an application bug: only wait if the shard really moved away.
                moved = moved or moved_out
                if not moved:
                    return False
            if self.topology.path is None or time.monotonic() >= deadline:
                return False
            time.sleep(0.05)


class Redirects:
    """The shards a Router routes by the redirect their old host recorded at a move's cutover, because
    its own topology file still names the old host (another app server's copy nobody updated). Each
    is kept until the file names another owner for the shard."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_shard: dict[int, tuple[Host, str]] = {}  # shard → (host to use, owner the file named)
        self._foreign: set[str] = set()  # hosts known only from a redirect: its DSN, no password

    def host(self, shard: int) -> Host | None:
        entry = self._by_shard.get(shard)
        return None if entry is None else entry[0]

    def names(self) -> dict[int, str]:
        return {n: host.name for n, (host, _) in dict(self._by_shard).items()}

    def foreign(self, name: str) -> bool:
        return name in self._foreign

    def follow(self, shard: int, redirect: dict, topology: Topology, old: Host) -> None:
        """Route ``shard`` to the redirect's host: the topology's own entry for it (its DSN and
        ``password_env``) when there is one, else the recorded DSN, without a password."""
        name = redirect["host"]
        host = next((h for h in topology.hosts if h.name == name), None)
        with self._lock:
            if host is None:
                host = Host(name=name, dsn=redirect["dsn"], shards=[])
                self._foreign.add(name)
            if self._by_shard.get(shard, (None,))[0] == host:
                return  # another thread followed it already
            self._by_shard[shard] = (host, topology.host_of(shard).name)
        log.warning("shard %s moved from %s to %s (redirect recorded by %s; this Router's topology file still "
                    "names %s)%s", shard, old.name, name, old.name, topology.host_of(shard).name,
                    f": {name} is not in this Router's topology, connecting with the recorded DSN "
                    f"{mask(redirect['dsn'])} without a password" if name in self._foreign else "")

    def reconcile(self, fresh: Topology) -> set[str]:
        """After the file was read again: forget the shards it caught up with (it names another owner
        than when the redirect was followed); the others go on with the file's current entry for their
        host. Returns the foreign hosts the file now has (their pools must be replaced)."""
        by_name = {h.name: h for h in fresh.hosts}
        with self._lock:
            self._by_shard = {n: (by_name.get(host.name, host), was) for n, (host, was) in self._by_shard.items()
                              if fresh.host_of(n).name == was}
            known = {name for name in self._foreign if name in by_name}
            self._foreign -= known
        return known


def _file_stamp(path: str | os.PathLike) -> tuple[int, int, int] | None:
    """(inode, size, mtime in ns) of the topology file: a flip (rename) or an edit changes it."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns
