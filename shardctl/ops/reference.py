"""The reference schema ``verify`` (and ``init``'s and ``migrate``'s check after their work) compares
every shard with: what the migration files define, built where nothing can shadow it.

A scratch database (``shardctl_ref_<random>``, copied from ``template0`` in the host database's
encoding, dropped again in a ``finally``: an empty database of the same server, as Atlas's "dev
database" is) receives the host database's database-wide default privileges, the host-level
migrations, then one reference shard (the template's schema, sequence and ``next_id()``) and the
shard migrations one version at a time; after each version its catalog is read object by object and
fingerprinted (``sql/fingerprint.py``, which writes the schema's own name as ``{schema}.``). Nothing
but the reference lives there, so a catalog lookup without a schema filter finds nothing of a
shard's or of ``public``'s: the reference is what the files say, not what the fleet did. One is
built per server major version (``for_hosts``), on a server of that version, so the catalog's text
and the extensions available are the shards'.

``Reference.prints[v]`` is the fingerprint at version ``v`` (0: the template alone), so a shard whose
ledger is at ``v`` is compared with the schema it should have at ``v``; ``Reference.made_by`` names
the migration that gave an object its reference definition.

A complete reference is kept in the building host's ``shardctl.meta`` (one entry, ``REFERENCE_KEY``),
keyed by a digest of everything that goes into it: the SQL each migration, host-level file and the
shard template render to there, the functions left out, the catalog query, the server's exact
version, the database's encoding and default privileges, the extensions the server offers, and
shardctl's version. The next ``verify``, ``init`` or ``migrate`` on the same files reads it instead
of building a scratch database again (about 0.5-1 s of a host's time); any change of those inputs
builds a new one. It is still built where nothing can shadow it, never read from a shard.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg

from ..engine import connections as db
from ..engine.fanout import for_each_host
from ..errors import ShardctlError
from ..model.dsn import mask
from ..model.topology import Host, Topology
from ..sql import fingerprint, session
from ..sql.catalog import ledger as ledger_q
from ..sql.catalog.verify import (
    available_extensions,
    database_facts,
    default_privilege_statements,
    idle_databases,
)
from ..sql.databases import create_database, drop_database
from ..sql.host_migrations import EXT_SCHEMA, HostLevelMigration
from ..sql.migrations import Migration
from ..sql.render import render_shard
from ..version import __version__

PREFIX = "shardctl_ref_"
# A scratch database older than this with nobody connected was left by a run that was killed.
STALE_SECONDS = 3600
# Where the last complete reference built on a host is kept (shardctl.meta): {"key": …, "reference": …}
REFERENCE_KEY = "verify.reference"


@dataclass
class Reference:
    """The reference schema, version by version, as built on ``host``."""

    host: str
    shard: int  # the shard the migrations were rendered for
    server_version: int = 0  # server_version_num of the server that built it
    prints: dict[int, str] = field(default_factory=dict)  # version → fingerprint
    objects: dict[int, dict[fingerprint.Key, str]] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)  # version → migration file
    # why the reference stops short of the last version (or was not built at all); None: complete
    error: str | None = None
    # what the build met without failing: a host-level file that acts on the cluster, say
    notes: list[str] = field(default_factory=list)
    cached: bool = False  # read from the host's shardctl.meta, built by an earlier run

    @property
    def built(self) -> bool:
        return bool(self.prints)

    def made_by(self, key: fingerprint.Key, version: int, case: str = "missing") -> str:
        """Which migration gave ``key`` the state it has in the reference at ``version``: the one that
        should have made it (``case`` "missing"), that dropped it or none (an "extra" object), or that
        defines it as the reference has it ("differs")."""
        want = self.objects[version].get(key)
        v = version
        while v > 0 and self.objects[v - 1].get(key) == want:
            v -= 1
        if want is None:
            return f"{self.names[v]} dropped it" if v else "no migration makes it"
        what = self.names[v] if v else "the shard template"
        return f"{what} defines it so" if case == "differs" else f"{what} should have made it"


def scratch_name(now: float | None = None) -> str:
    """``shardctl_ref_<unix time>_<random>``: the time lets a later run tell a leftover from a build
    in progress."""
    return f"{PREFIX}{int(time.time() if now is None else now)}_{secrets.token_hex(4)}"


def sweep(admin: psycopg.Connection, ref: Reference) -> None:
    """Drop the scratch databases a killed run left behind (older than STALE_SECONDS, nobody
    connected), saying so in ``ref.notes``."""
    for name in idle_databases(admin, PREFIX):
        stamp = name[len(PREFIX) :].split("_", 1)[0]
        if stamp.isdigit() and time.time() - int(stamp) > STALE_SECONDS:
            try:
                drop_database(admin, name)
            except psycopg.Error:  # another run got there first, or no right to: leave it
                continue
            ref.notes.append(f"dropped {name}, a scratch database a killed run left behind")


def build(
    topo: Topology,
    host: Host,
    migrations: list[Migration],
    host_level: list[HostLevelMigration],
    per_shard: tuple[str, ...],
    *,
    shard: int = 0,
    connect_timeout: int = db.DEFAULT_CONNECT_TIMEOUT,
    admin: psycopg.Connection | None = None,
) -> Reference:
    """Build the reference on ``host`` (see the module doc). A database error becomes
    ``Reference.error`` (with the versions built before it kept); an unreachable host raises.
    ``admin``: an open autocommit connection to the host's database to create and drop the scratch
    database over (init's and migrate's lock connection), else one of its own."""
    if admin is None:
        with db.connect(
            host, autocommit=True, connect_timeout=connect_timeout, purpose="verify reference"
        ) as conn:
            return build(
                topo,
                host,
                migrations,
                host_level,
                per_shard,
                shard=shard,
                connect_timeout=connect_timeout,
                admin=conn,
            )
    ref = Reference(host.name, shard, names={m.version: m.name for m in migrations})
    name = scratch_name()
    encoding, ref.server_version = database_facts(admin)
    defaults = default_privilege_statements(admin)
    sweep(admin, ref)
    swept = len(ref.notes)
    key = _cache_key(admin, topo, host, ref, migrations, host_level, per_shard, encoding, defaults)
    cached = _cached(admin, key, ref)
    if cached is not None:
        return cached
    try:
        create_database(admin, name, encoding=encoding)
    except psycopg.errors.InsufficientPrivilege:
        ref.error = (
            f"role {admin.info.user!r} may not CREATE DATABASE on {host.name}, so verify could not "
            f"build the reference schema there (grant CREATEDB, or run verify as a role that has it)"
        )
        return ref
    except psycopg.Error as exc:
        ref.error = f"could not create the reference database on {host.name}: {_line(exc)}"
        return ref
    try:
        with db.connect(
            host,
            autocommit=True,
            connect_timeout=connect_timeout,
            purpose="verify reference",
            database=name,
        ) as conn:
            _fill(conn, topo, host, ref, migrations, host_level, per_shard, defaults)
    finally:
        try:
            drop_database(admin, name)
        except psycopg.Error as exc:  # the reference is built; say what was left behind
            ref.notes.append(f"could not drop the scratch database {name}: {_line(exc)}")
    if key is not None and ref.error is None and len(ref.notes) == swept:  # met nothing odd
        _keep(admin, key, ref)
    return ref


def _cache_key(
    admin: psycopg.Connection,
    topo: Topology,
    host: Host,
    ref: Reference,
    migrations: list[Migration],
    host_level: list[HostLevelMigration],
    per_shard: tuple[str, ...],
    encoding: str,
    defaults: list[str],
) -> str | None:
    """The digest of every input of the reference ``build`` would make (see the module doc); None
    when a file does not render (the build says why) or the host keeps no control schema."""
    if not ledger_q.meta_exists(admin):
        return None
    try:
        doc = {
            "shardctl": __version__,
            "query": fingerprint.OBJECTS_SQL,
            "server": ref.server_version,
            "encoding": encoding,
            "defaults": defaults,
            "extensions": available_extensions(admin),
            "per_shard": list(per_shard),
            "host_level": [[m.name, m.transactional, m.sql(topo, host.name)] for m in host_level],
            "template": render_shard(topo, ref.shard),
            "schema": topo.schema_name(ref.shard),
            "migrations": [[m.name, m.transactional, m.sql(topo, ref.shard)] for m in migrations],
        }
    except ShardctlError:
        return None
    return hashlib.sha256(json.dumps(doc, default=str).encode()).hexdigest()


def _cached(admin: psycopg.Connection, key: str | None, ref: Reference) -> Reference | None:
    """The reference kept under ``key`` on this host, or None."""
    if key is None:
        return None
    kept = ledger_q.read_meta(admin, REFERENCE_KEY)
    if not isinstance(kept, dict) or kept.get("key") != key:
        return None
    doc = kept["reference"]
    ref.prints = {int(v): p for v, p in doc["prints"].items()}
    ref.objects = {
        int(v): {(kind, tbl, name): text for kind, tbl, name, text in rows}
        for v, rows in doc["objects"].items()
    }
    ref.cached = True
    return ref


def _keep(admin: psycopg.Connection, key: str, ref: Reference) -> None:
    """Keep a complete reference for the next run (a role that may not write the control schema
    builds it every time)."""
    doc = {
        "prints": {str(v): p for v, p in ref.prints.items()},
        "objects": {
            str(v): [[*k, text] for k, text in sorted(objs.items())]
            for v, objs in ref.objects.items()
        },
    }
    try:
        ledger_q.write_meta(admin, REFERENCE_KEY, json.dumps({"key": key, "reference": doc}))
    except psycopg.errors.InsufficientPrivilege:
        pass


def _fill(
    conn: psycopg.Connection,
    topo: Topology,
    host: Host,
    ref: Reference,
    migrations: list[Migration],
    host_level: list[HostLevelMigration],
    per_shard: tuple[str, ...],
    defaults: list[str] = (),  # type: ignore[assignment]
) -> None:
    """The host database's default privileges (new shard objects take them), host-level files, the
    template, then each shard migration, reading the catalog after each."""
    schema = topo.schema_name(ref.shard)
    for text in defaults:
        try:
            conn.execute(text)
        except psycopg.Error as exc:
            ref.notes.append(
                f"default privileges not copied to the reference database: {_line(exc)}"
            )
    for m in host_level:
        # A host-level file may act on the cluster (a role that exists already): the shard migrations
        # then find what it made, so the reference goes on and says which file failed.
        try:
            _run(conn, m.sql(topo, host.name), EXT_SCHEMA, m.transactional)
        except psycopg.Error as exc:
            ref.notes.append(f"host-level {m.name} failed in the reference database: {_line(exc)}")
    try:
        _run(conn, render_shard(topo, ref.shard), EXT_SCHEMA, True)
    except psycopg.Error as exc:
        ref.error = f"the shard template fails in an empty database on {host.name}: {_line(exc)}"
        return
    _read(conn, ref, 0, schema, per_shard)
    path = session.search_path(schema)
    for m in migrations:
        try:
            text = m.sql(topo, ref.shard)
            _run(conn, text, path, m.transactional)
        except (psycopg.Error, ShardctlError) as exc:
            ref.error = (
                f"{m.name} fails in an empty database on {host.name} ({_line(exc)}), though the "
                f"shards ran it: it depends on something outside the shard"
            )
            return
        _read(conn, ref, m.version, schema, per_shard)


def _run(conn: psycopg.Connection, text: str, path: str, transactional: bool) -> None:
    if transactional:
        with conn.transaction():
            conn.execute(session.settings_text({"search_path": path}))
            conn.execute(text)
        return
    conn.execute(session.settings_text({"search_path": path}, local=False))
    try:
        conn.execute(text)
    finally:
        conn.execute(session.RESET_PATH)


def _read(
    conn: psycopg.Connection, ref: Reference, version: int, schema: str, per_shard: tuple[str, ...]
) -> None:
    found, prints = fingerprint.objects_and_prints(conn, [schema], per_shard)
    ref.objects[version], ref.prints[version] = found[schema], prints.get(schema, "")


def _line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in mask(str(exc)).splitlines() if ln.strip()]
    return lines[0] if lines else type(exc).__name__


def for_hosts(
    hosts: list[Host],
    majors: dict[str, int],
    build_on: Callable[[Host], Reference],
    first: Reference | None = None,
) -> dict[str, Reference]:
    """One reference per server major version, shared by every host of that version: the catalog
    text of one major version is the same on every server, so building it once is enough. ``majors``:
    host → its server's major version (a host missing from it gets no reference); ``first``: one
    already built (on any host). Where a build cannot make the scratch database (no CREATEDB there),
    the next host of that version is tried; a version where none can keeps the failed reference, whose
    ``error`` says what could not be proven."""
    by_major: dict[int, Reference] = {}
    if first is not None:
        by_major[first.server_version // 10000] = first
    wanted = {m for m in majors.values() if m not in by_major or not by_major[m].built}

    def one(major: int) -> tuple[int, Reference | None]:
        ref = by_major.get(major)
        tried = {ref.host} if ref is not None else set()
        for host in hosts:
            if majors.get(host.name) == major and host.name not in tried:
                try:
                    ref = build_on(host)
                except (ShardctlError, psycopg.Error) as exc:  # gone since: the next one
                    ref = Reference(host.name, 0, error=f"{host.name}: {_line(exc)}")
                if ref.built:
                    break
        return major, ref

    by_major.update({m: r for m, r in for_each_host(sorted(wanted), one) if r is not None})
    return {
        h.name: by_major[majors[h.name]]
        for h in hosts
        if h.name in majors and majors[h.name] in by_major
    }
