"""The topology file (``shardctl.yaml``): load, validate, and answer "where does shard N live".

Everything is validated before any connection is opened; problems raise
:class:`ConfigErrors` naming the file and line.
"""

from __future__ import annotations

import functools
import os
import re
import string
import sys
import warnings
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..errors import ConfigError, ConfigErrors
from . import dsn as dsnlib
from . import yaml_doc, yaml_guard
from .adoption import Adoption, IdMap, adoption_section, default_id_map
from .identifiers import MAX_IDENTIFIER_BYTES, identifier_problem
from .layouts import MINTABLE, Layout, by_name, iso, parse_epoch
from .numbers import echo
from .ranges import MAX_SHARDS, format_shards, parse_shards

DEFAULT_FILE = "shardctl.yaml"
CONFIG_ENV = "SHARDCTL_CONFIG"
FUNCTIONS = ("plpgsql", "sql")
STRING_HASHES = ("md5",)

MAX_ERRORS = 20  # problems listed; the rest are counted
MAX_MESSAGE = 300  # characters of one problem (a message never repeats a whole huge value)
MAX_UNKNOWN_KEYS = 3  # unknown keys listed per mapping

TOP_KEYS = {
    "version",
    "id",
    "shards",
    "hosts",
    "templates",
    "migrations",
    "routing",
    "placement",
    "lint",
    "adoption",
}
ID_KEYS = {"layout", "epoch", "function", "bits"}
SHARDS_KEYS = {"count", "schema"}
HOST_KEYS = {
    "name",
    "dsn",
    "admin_dsn",
    "peer_dsn",
    "password_env",
    "standby",
    "shards",
    "max_jobs",
    "pooler",
}
# What stands between the Router and a host's ``dsn``: ``transaction`` (the default, the safe choice: no
# prepared statements, nothing kept on the server between transactions), ``session`` or ``none``.
POOLER_MODES = ("transaction", "session", "none")
# What each DSN of a host is for; each defaults to the one before it.
DSN_PURPOSES = ("app", "admin", "peer")
ROUTING_KEYS = {"key", "strings", "modulus"}
# pinned: read by ops.rebalance (shards that never move); global_host: where an adopted database's
# global (unsharded) tables live (ops/adopt)
PLACEMENT_KEYS = {"new_objects", "pinned", "global_host"}
BITS_KEYS = {"time", "shard", "sequence"}
LINT_KEYS = {"exclude", "include", "pg_version"}


_WARNED: set[str] = set()  # LayoutWarning messages already given in this process


def _outside_shardctl() -> int:
    """The ``stacklevel`` that makes a warning point at the first caller outside the shardctl package
    (the application's ``Topology.load`` or ``Router(...)`` line), however deep inside it was given."""
    package = os.path.dirname(os.path.dirname(__file__)) + os.sep  # as the frames name their files
    frame, level = sys._getframe(1), 1  # the frame that calls warnings.warn is level 1
    while frame is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    return level


class LayoutWarning(UserWarning):
    """The topology is valid but has a consequence the user should know about."""


@dataclass
class Host:
    name: str
    dsn: str
    shards: list[int]
    password_env: str | None = None
    standby: str | None = None
    admin_dsn: str | None = None  # shardctl's own DDL, locks and moves (direct, not via a pooler)
    peer_dsn: str | None = None  # how other hosts' subscriptions reach this host
    # at most this many connections applying shards at once (see docs/performance.md)
    max_jobs: int | None = None
    # what the app ``dsn`` goes through (POOLER_MODES); the Router's behaviour
    pooler: str = "transaction"

    @property
    def keeps_sessions(self) -> bool:
        """True when a client connection keeps its server session (no transaction pooler on ``dsn``)."""
        return self.pooler != "transaction"

    def dsn_for(self, purpose: str = "app") -> str:
        """The DSN for ``purpose``: app (``dsn``), admin (``admin_dsn``) or peer (``peer_dsn``).

        Each falls back to the one before it: peer → admin → app.
        """
        if purpose not in DSN_PURPOSES:
            raise ValueError(f"unknown DSN purpose {purpose!r} (one of {', '.join(DSN_PURPOSES)})")
        if purpose == "peer" and self.peer_dsn:
            return self.peer_dsn
        if purpose in ("admin", "peer") and self.admin_dsn:
            return self.admin_dsn
        return self.dsn

    def connect_kwargs(self, purpose: str = "app", **extra: object) -> dict[str, object]:
        """``psycopg.connect`` keyword arguments for the DSN of ``purpose`` (see :meth:`dsn_for`)."""
        return dsnlib.connect_kwargs(self.dsn_for(purpose), self.password_env, **extra)

    @property
    def masked_dsn(self) -> str:
        return dsnlib.mask(self.dsn)

    def masked_dsns(self) -> dict[str, str]:
        """Every DSN this host sets, masked: ``dsn`` and, when given, ``admin_dsn`` and ``peer_dsn``."""
        out = {"dsn": dsnlib.mask(self.dsn)}
        for key in ("admin_dsn", "peer_dsn"):
            value = getattr(self, key)
            if value:
                out[key] = dsnlib.mask(value)
        return out


@dataclass
class Topology:
    """A validated topology. Build with :meth:`load` or :meth:`from_text`."""

    layout: Layout
    function: str
    shard_count: int
    schema_format: str
    hosts: list[Host]
    path: Path | None = None
    templates_dir: Path | None = None
    migrations_dir: Path | None = None
    routing_key: str | None = None
    string_hash: str = "md5"
    modulus: int = 0
    new_objects: list[int] | None = None
    global_host: str | None = None  # placement.global_host: the host of unsharded (global) tables
    lint: dict[str, Any] = field(default_factory=dict)  # `shardctl lint` settings (sql/lint.py)
    adoption: Adoption | None = None  # an existing database being adopted (model/adoption.py)
    warnings: list[str] = field(default_factory=list)
    _owner: dict[int, Host] = field(default_factory=dict, repr=False)
    _schema_shards: dict[str, int] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.modulus = self.modulus or self.shard_count
        self._owner = {n: h for h in self.hosts for n in h.shards}

    # ---- loading ---------------------------------------------------------
    @classmethod
    def load(
        cls, path: str | os.PathLike | None = None, *, allow_inline_password: bool = False
    ) -> Topology:
        """Load and validate a topology file. ``path`` None means ``$SHARDCTL_CONFIG`` or ./shardctl.yaml."""
        chosen = Path(path) if path else Path(os.environ.get(CONFIG_ENV) or DEFAULT_FILE)
        try:
            text = yaml_guard.read_limited(chosen)  # at most yaml_guard.MAX_BYTES are ever read
        except FileNotFoundError:
            raise ConfigError(
                f"topology file not found: {chosen} (use --config or ${CONFIG_ENV})"
            ) from None
        except yaml_guard.LimitExceeded as exc:
            raise ConfigError(str(exc), path=str(chosen)) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(
                f"cannot read topology file {chosen}: {echo(str(exc), 200)}"
            ) from None
        return cls.from_text(text, path=chosen, allow_inline_password=allow_inline_password)

    @classmethod
    def from_text(
        cls,
        text: str,
        *,
        path: str | os.PathLike | None = None,
        allow_inline_password: bool = False,
    ) -> Topology:
        return _Validator(text, Path(path) if path else None, allow_inline_password).build()

    # ---- questions -------------------------------------------------------
    def schema_name(self, shard: int) -> str:
        return format_schema(self.schema_format, shard)

    def shard_of_schema(self, name: str) -> int | None:
        """The shard a schema name stands for (any shard the layout's bits allow), or None.

        A plain format (``insta{n}``: the number once, no format spec) is read back from the name
        itself. Any other is looked up in a name → shard map, built once per topology.
        """
        limit = min(self.layout.max_shards, MAX_SHARDS)  # a custom layout may have 2**40 shards
        affixes = _plain_affixes(self.schema_format)
        if affixes is not None:
            shard = _plain_number(name, *affixes)
            return shard if shard is not None and shard < limit else None
        if self._schema_shards is None:
            self._schema_shards = {self.schema_name(n): n for n in range(limit)}
        return self._schema_shards.get(name)

    def id_map_place(self) -> IdMap:
        """Where an adoption's id map is: ``adoption.id_map``, else the global host (or the first)
        and the default database name."""
        if self.adoption is not None and self.adoption.id_map is not None:
            return self.adoption.id_map
        return default_id_map(self.global_host, self.hosts[0].name)

    def host_of(self, shard: int) -> Host:
        try:
            return self._owner[shard]
        except KeyError:
            from ..errors import BadInput

            raise BadInput(
                f"shard {shard} is not in this topology (0..{self.shard_count - 1})"
            ) from None

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        from ..errors import BadInput

        raise BadInput(f"unknown host {name!r} (hosts: {', '.join(h.name for h in self.hosts)})")

    def summary(self) -> dict[str, Any]:
        """What ``info`` shows: layout, limits and shards per host."""
        return {
            "config": str(self.path) if self.path else None,
            "layout": self.layout.name,
            "bits": self.layout.describe(),
            "epoch": iso(self.layout.epoch),
            "function": self.function,
            "shard_count": self.shard_count,
            "routing_modulus": self.modulus,
            "schema_format": self.schema_format,
            "limits": self.layout.limits(),
            "hosts": [
                {
                    "name": h.name,
                    **h.masked_dsns(),
                    "shards": format_shards(h.shards),
                    "shard_count": len(h.shards),
                }
                for h in self.hosts
            ],
            "warnings": list(self.warnings),
        }


def _parse_yaml(text: str, fast: bool = True) -> Any:
    """The round-trip document of ``text``; LimitExceeded (message and line) for anything wrong with it.

    A plain topology is built from libyaml's events (``yaml_doc``: the same values and lines, and
    ruamel is not even imported); anything else, or ``fast`` False, is loaded by ruamel.
    """
    # Before ruamel: an alias bomb or a huge file costs nothing.
    doc = yaml_guard.checked_document(text, build=fast)
    if doc is not yaml_doc.NOT_BUILT:
        return doc
    from ruamel.yaml import YAML
    from ruamel.yaml.error import MarkedYAMLError, YAMLError

    try:
        return YAML(typ="rt").load(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = (exc.problem or "invalid YAML").split("\n")[0]
        if "duplicate key" in problem or "found duplicate key" in str(exc):
            problem = (
                "duplicate key: "
                + str(exc).split("found duplicate key", 1)[-1].split("\n")[0].strip()
            )
        raise yaml_guard.LimitExceeded(
            f"invalid YAML: {problem}", mark.line + 1 if mark else None
        ) from None
    except YAMLError as exc:
        raise yaml_guard.LimitExceeded(f"invalid YAML: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - ruamel itself fails on some inputs, e.g. TypeError
        # for a mapping key that holds a list ("? x:\n  - a"); no such text is a topology.
        raise yaml_guard.LimitExceeded(
            f"invalid YAML: cannot build the document ({type(exc).__name__}: {exc})"
        ) from None


def _same_server(hosts: list[Host], lines: list[int | None]) -> list[tuple[str, int | None]]:
    """Hosts on a server and database an earlier host already names: one host listed twice
    (its runs would wait on its own lock). Returns (problem, line) pairs."""
    seen: dict[tuple[str, str, str], str] = {}
    problems = []
    for host, line in zip(hosts, lines):
        where = server_database(host.dsn_for("admin"))  # where shardctl takes its lock
        if where is None:
            continue
        if where in seen:
            problems.append(
                (
                    (
                        f"hosts {seen[where]} and {host.name} point at the same server and database "
                        f"({where[0] or 'local socket'}:{where[1]}/{where[2]}); each host needs its own"
                    ),
                    line,
                )
            )
        else:
            seen[where] = host.name
    return problems


def server_database(dsn: str) -> tuple[str, str, str] | None:
    """(host, port, database) a DSN connects to, as far as the DSN itself says; None if it cannot tell.

    Unset parts take libpq's defaults (port 5432, database named after the user); a DSN that
    names neither database nor user depends on the environment and is not compared.
    """
    try:
        parts = dsnlib.parse(dsn) if dsn else None
    except ValueError:
        return None
    if parts is None:
        return None
    database = parts.get("dbname") or parts.get("user")
    if not database:
        return None
    host = (parts.get("host") or parts.get("hostaddr") or "").lower()
    return host, parts.get("port") or "5432", database


def format_schema(fmt: str, shard: int) -> str:
    return fmt.format(shard, n=shard)


@functools.lru_cache(maxsize=64)
def _plain_affixes(fmt: str) -> tuple[str, str] | None:
    """(prefix, suffix) when ``fmt`` formats shard ``n`` as exactly prefix + str(n) + suffix (one
    ``{n}`` or ``{}``, with no format spec or conversion); None for any other format."""
    try:
        parts = list(string.Formatter().parse(fmt))
    except ValueError:
        return None
    fields = [(f, spec, conv) for _, f, spec, conv in parts if f is not None]
    if len(fields) != 1 or fields[0] not in (("n", "", None), ("", "", None)):
        return None
    prefix, suffix, seen = "", "", False
    for literal, f, _, _ in parts:
        if seen:
            suffix += literal
        else:
            prefix += literal
        seen = seen or f is not None
    return prefix, suffix


def _plain_number(name: str, prefix: str, suffix: str) -> int | None:
    """The n for which ``name`` is prefix + str(n) + suffix, or None."""
    if len(name) <= len(prefix) + len(suffix) or not (
        name.startswith(prefix) and name.endswith(suffix)
    ):
        return None
    digits = name[len(prefix) : len(name) - len(suffix)]
    if not (digits.isascii() and digits.isdigit()) or (digits[0] == "0" and digits != "0"):
        return None
    return int(digits)


# What str.format can raise for a format string that passed the checks below
# (e.g. "{n:{n.x}}" hides an attribute lookup inside the format spec).
_FORMAT_ERRORS = (
    ValueError,
    IndexError,
    KeyError,
    AttributeError,
    TypeError,
    OverflowError,
    MemoryError,
)


def _check_schema_format(fmt: str) -> str | None:
    try:
        parsed = [(f, spec) for _, f, spec, _ in string.Formatter().parse(fmt) if f is not None]
    except ValueError as exc:
        return f"shards.schema {fmt!r} is not a valid format string: {exc}"
    fields = [f for f, _ in parsed]
    if not fields:
        return f'shards.schema {fmt!r} must contain the shard number, e.g. "insta{{n}}" or "shard{{:04d}}"'
    bad = [f for f in fields if f not in ("", "n")]
    if bad:
        return f"shards.schema {fmt!r} may only use {{n}} (or {{}}), not {{{bad[0]}}}"
    if not all((spec or "").isascii() for _, spec in parsed):
        return f"shards.schema {echo(fmt)} has non-ASCII characters in a format spec (digits must be 0-9)"
    # A width like {n:999999999} would build a gigabyte string before the length check sees it.
    if any(
        len(d) > 4 or int(d) > MAX_IDENTIFIER_BYTES
        for _, spec in parsed
        for d in re.findall(r"[0-9]+", spec or "")
    ):
        return f"shards.schema {fmt!r} pads the shard number beyond {MAX_IDENTIFIER_BYTES} bytes"
    try:
        format_schema(fmt, 0)
    except _FORMAT_ERRORS as exc:
        return f"shards.schema {fmt!r} cannot format a shard number: {exc}"
    return None


def _line_of(node: Any, key: Any = None) -> int | None:
    """1-based line of ``node`` (or of its key / item ``key``) in the round-trip document, if known."""
    try:
        if key is None:
            return node.lc.line + 1
        if isinstance(key, int):
            return node.lc.item(key)[0] + 1
        return node.lc.key(key)[0] + 1
    except (AttributeError, KeyError, IndexError, TypeError):
        return None


def _schema_names_problem(fmt: str, count: int) -> str | None:
    """The first shard whose schema name is not a safe identifier or repeats another's, or None."""
    # prefix + str(n) + suffix: distinct for distinct n; a name with digits is no key word or taken
    # name, and only its length changes with n, so the first and the last shard decide.
    if (
        count > 0
        and _plain_affixes(fmt) is not None
        and all(identifier_problem(format_schema(fmt, n)) is None for n in (0, count - 1))
    ):
        return None
    names: dict[str, int] = {}
    for n in range(count):
        try:
            name = format_schema(fmt, n)
        except _FORMAT_ERRORS as exc:
            return f"shards.schema {fmt!r} cannot format shard number {n}: {exc}"
        why = identifier_problem(name)
        if why:
            return f"shards.schema {fmt!r} gives schema name {name!r} for shard {n}, which {why}"
        if name in names:
            return f"shards.schema {fmt!r} gives the same schema {name!r} to shards {names[name]} and {n}"
        names[name] = n
    return None


class Problems:
    """Where validation reports what is wrong: each problem with its line, at most ``MAX_ERRORS`` listed
    (the rest counted), raised together by :meth:`fail`.

    The section validators below are given one and report into it; they share nothing else."""

    def __init__(self, path: Path | None):
        self.path = path
        self.errors: list[ConfigError] = []
        self.unlisted = 0

    line_of = staticmethod(_line_of)

    def error(self, message: str, line: int | None = None) -> None:
        if len(self.errors) >= MAX_ERRORS:
            self.unlisted += 1
            return
        message = message.replace("\n", " ")
        if len(message) > MAX_MESSAGE:
            message = message[: MAX_MESSAGE - 1] + "…"
        self.errors.append(
            ConfigError(message, path=str(self.path) if self.path else None, line=line)
        )

    def fail(self) -> None:
        """Raise every problem reported so far as one :class:`ConfigErrors` (nothing if there is none)."""
        if self.errors:
            if self.unlisted:
                self.errors.append(
                    ConfigError(
                        f"{self.unlisted} more problem(s) not listed",
                        path=str(self.path) if self.path else None,
                    )
                )
                self.unlisted = 0
            raise ConfigErrors(self.errors)

    def mapping(self, parent: Any, key: str, known: set[str], required: bool = True) -> Any:
        """``parent[key]`` when it is a mapping with only ``known`` keys (else reported); None if absent."""
        value = parent.get(key) if isinstance(parent, dict) else None
        if value is None:
            if required:
                self.error(
                    f"missing section '{key}'", self.line_of(parent, key) if key in parent else None
                )
            return None
        if not isinstance(value, dict):
            self.error(f"'{key}' must be a mapping", self.line_of(parent, key))
            return None
        self.unknown_keys(value, known, key)
        return value

    def unknown_keys(self, node: Any, known: set[str], where: str) -> None:
        """One problem per mapping: its first unknown key, and how many more there are."""
        unknown = [k for k in node if k not in known]
        if not unknown:
            return
        first = (
            echo(unknown[0])
            if not isinstance(unknown[0], str) or len(unknown[0]) > 60
            else unknown[0]
        )
        more = ""
        if len(unknown) > 1:
            shown = ", ".join(echo(k, 20) for k in unknown[1 : MAX_UNKNOWN_KEYS + 1])
            more = f"; {len(unknown) - 1} more unknown key(s) there: {shown}{', …' if len(unknown) > 4 else ''}"
        self.error(
            f"unknown key '{first}' in {where} (expected one of: {', '.join(sorted(known))}){more}",
            self.line_of(node, unknown[0]),
        )


@dataclass
class _Ownership:
    """Which host owns each shard, as the hosts are read: the first owner, and every shard two hosts claim."""

    owners: dict[int, str] = field(default_factory=dict)
    overlaps: dict[tuple[str, str], list[int]] = field(default_factory=dict)

    def claim(self, host: str, shards: list[int]) -> None:
        for n in shards:
            if n in self.owners:
                self.overlaps.setdefault((self.owners[n], host), []).append(n)
            else:
                self.owners[n] = host


class HostsValidator:
    """The ``hosts:`` section: names, DSNs (per purpose), shard ranges, standbys, limits.

    Given where to report problems, whether a DSN may hold a literal password, and the highest
    number a shard range may reach; :meth:`validate` takes the whole document (for ``hosts`` and its
    line) and the shard count, and returns a :class:`Host` per usable entry."""

    def __init__(self, problems: Problems, *, allow_inline_password: bool, range_limit: int):
        self.problems = problems
        self.allow_inline_password = allow_inline_password
        self.range_limit = range_limit

    def validate(self, doc: Any, count: int) -> list[Host]:
        p = self.problems
        hosts_node = doc.get("hosts")
        if not isinstance(hosts_node, list) or not hosts_node:
            p.error(
                "'hosts' must be a non-empty list of hosts",
                p.line_of(doc, "hosts") if "hosts" in doc else None,
            )
            return []
        if len(hosts_node) > yaml_guard.MAX_HOSTS:
            p.error(
                f"'hosts' lists {len(hosts_node)} hosts; shardctl handles at most {yaml_guard.MAX_HOSTS}",
                p.line_of(doc, "hosts"),
            )
            return []
        hosts: list[Host] = []
        names: dict[str, int | None] = {}
        ownership = _Ownership()
        dsn_lines: list[int | None] = []
        for i, node in enumerate(hosts_node):
            if not isinstance(node, dict):
                p.error(
                    f"hosts[{i}] must be a mapping with name, dsn and shards",
                    p.line_of(hosts_node, i),
                )
                continue
            host = self.host(i, node, p.line_of(hosts_node, i), names)
            ownership.claim(host.name, host.shards)
            hosts.append(host)
            dsn_lines.append(p.line_of(node, "dsn") or p.line_of(node))  # a merged dsn has no line
        self.fleet_checks(doc, count, hosts, dsn_lines, ownership)
        return hosts

    def fleet_checks(
        self,
        doc: Any,
        count: int,
        hosts: list[Host],
        dsn_lines: list[int | None],
        ownership: _Ownership,
    ) -> None:
        """What no single host shows: one server listed twice, shards owned twice or by nobody."""
        p = self.problems
        for message, line in _same_server(hosts, dsn_lines):
            p.error(message, line)
        for (first, second), nums in ownership.overlaps.items():
            p.error(
                f"shards {format_shards(nums)} are owned by both {first} and {second}",
                p.line_of(doc, "hosts"),
            )
        if count and not any("shards:" in e.problem for e in p.errors):
            gaps = [n for n in range(count) if n not in ownership.owners]
            if gaps:
                p.error(
                    f"shards {format_shards(gaps)} are owned by no host (every shard 0..{count - 1} "
                    f"needs exactly one)",
                    p.line_of(doc, "hosts"),
                )

    def host(self, i: int, node: Any, line: int | None, names: dict[str, int | None]) -> Host:
        """One entry of ``hosts`` (a mapping); ``names`` holds the names seen so far and their lines."""
        p = self.problems
        p.unknown_keys(node, HOST_KEYS, f"hosts[{i}]")
        name = node.get("name")
        if not isinstance(name, str) or not name.strip():
            p.error(f"hosts[{i}] needs a name", line)
            name = f"hosts[{i}]"
        elif name in names:
            p.error(
                f"host name {name!r} is used twice (first at line {names[name]})",
                p.line_of(node, "name"),
            )
        else:
            names[name] = p.line_of(node, "name")
        dsn_text = node.get("dsn")
        if not isinstance(dsn_text, str) or not dsn_text.strip():
            p.error(f"host {name} needs a dsn (a libpq connection string)", line)
            dsn_text = ""
        else:
            self.check_dsn(name, "dsn", dsn_text, p.line_of(node, "dsn"))
        standby = node.get("standby")
        if standby is not None:
            if isinstance(standby, str):
                self.check_dsn(name, "standby", standby, p.line_of(node, "standby"))
            else:
                p.error(f"host {name}: standby must be a DSN string", p.line_of(node, "standby"))
        settings = self.settings(name, node)
        shards = self.shards(name, node, line)
        return Host(
            name=name,
            dsn=dsn_text,
            shards=shards,
            standby=standby if isinstance(standby, str) else None,
            **settings,
            **self.purpose_dsns(name, node),
        )

    def settings(self, name: str, node: Any) -> dict[str, Any]:
        """A host's ``password_env``, ``max_jobs`` and ``pooler`` (a bad value is reported and dropped)."""
        p = self.problems
        password_env = node.get("password_env")
        if password_env is not None and (
            not isinstance(password_env, str) or not password_env.strip()
        ):
            p.error(
                f"host {name}: password_env must name an environment variable",
                p.line_of(node, "password_env"),
            )
            password_env = None
        max_jobs = node.get("max_jobs")
        if max_jobs is not None and (
            isinstance(max_jobs, bool) or not isinstance(max_jobs, int) or max_jobs < 1
        ):
            p.error(
                f"host {name}: max_jobs must be a positive integer", p.line_of(node, "max_jobs")
            )
            max_jobs = None
        pooler = node.get("pooler", "transaction")
        if pooler not in POOLER_MODES:
            p.error(
                f"host {name}: pooler must be one of {', '.join(POOLER_MODES)} (what the app dsn goes "
                f"through; transaction is the safe default)",
                p.line_of(node, "pooler"),
            )
            pooler = "transaction"
        return {"password_env": password_env, "max_jobs": max_jobs, "pooler": pooler}

    def shards(self, name: str, node: Any, line: int | None) -> list[int]:
        """A host's ``shards`` (a range, a list, or empty); [] after a problem."""
        if "shards" not in node:
            self.problems.error(
                f"host {name} needs 'shards' (a range like \"0-2047\", a list, or [] for none)",
                line,
            )
        elif node["shards"] != [] and node["shards"] is not None:
            try:
                return parse_shards(node["shards"], limit=self.range_limit)
            except ValueError as exc:
                self.problems.error(
                    f"host {name}: shards: {exc}", self.problems.line_of(node, "shards")
                )
        return []

    def purpose_dsns(self, host: str, node: Any) -> dict[str, str | None]:
        """A host's optional ``admin_dsn`` and ``peer_dsn``: absent, or valid DSN strings."""
        p = self.problems
        out: dict[str, str | None] = {}
        for key in ("admin_dsn", "peer_dsn"):
            value = node.get(key)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                p.error(
                    f"host {host}: {key} must be a libpq connection string", p.line_of(node, key)
                )
                value = None
            elif value is not None:
                self.check_dsn(host, key, value, p.line_of(node, key))
            out[key] = value
        return out

    def check_dsn(self, host: str, key: str, text: str, line: int | None) -> None:
        try:
            dsnlib.parse(text)
        except ValueError as exc:
            self.problems.error(
                f"host {host}: {key} is not a valid libpq connection string: {exc}", line
            )
            return
        if dsnlib.has_inline_password(text) and not self.allow_inline_password:
            self.problems.error(
                f"host {host}: {key} contains a literal password; put it in an environment variable named "
                f"by password_env (or pass --allow-inline-password)",
                line,
            )


class _Validator:
    """Parses a topology's text and runs each section's validator over it, collecting every problem
    with its line into one :class:`Problems`; :meth:`build` returns the Topology or raises them all."""

    def __init__(
        self, text: str, path: Path | None, allow_inline_password: bool, fast_yaml: bool = True
    ):
        self.text = text
        self.fast_yaml = fast_yaml  # False: always load with ruamel (tests compare both ways)
        self.path = path
        self.allow_inline_password = allow_inline_password
        self.problems = Problems(path)

    def document(self) -> dict:
        """The parsed YAML mapping (problems raised here: nothing else can be checked without it)."""
        p = self.problems
        try:
            doc = _parse_yaml(self.text, self.fast_yaml)
        except yaml_guard.LimitExceeded as exc:
            p.error(str(exc), exc.line)
            p.fail()
        if not isinstance(doc, dict):
            p.error("the topology must be a YAML mapping with version, id, shards and hosts")
            p.fail()
        p.unknown_keys(doc, TOP_KEYS, "the top level")
        version = doc.get("version")
        if version != 1:
            p.error(
                f"version must be 1, got {echo(version)}"
                if "version" in doc
                else "missing 'version: 1'",
                p.line_of(doc, "version") if "version" in doc else None,
            )
        return doc

    def build(self) -> Topology:
        p = self.problems
        doc = self.document()
        layout, function = id_section(p, doc)
        count, schema_format = shards_section(p, doc, layout)
        # With no usable count, shard ranges are still checked, against what the layout could
        # hold (capped, so a range like "0-99999999999" is not expanded number by number).
        range_limit = count or min(layout.max_shards, yaml_guard.MAX_SHARDS)
        host_checks = HostsValidator(
            p, allow_inline_password=self.allow_inline_password, range_limit=range_limit
        )
        hosts = host_checks.validate(doc, count)
        routing = routing_section(p, doc, count)
        new_objects = placement_section(p, doc, range_limit)
        global_host = global_host_setting(p, doc, hosts)
        lint = lint_section(p, doc)
        adoption = adoption_section(p, doc, host_checks, [h.name for h in hosts], Host)
        base = self.path.parent if self.path else Path.cwd()
        dirs = {}
        for key in ("templates", "migrations"):
            value = doc.get(key)
            if value is not None and not isinstance(value, str):
                p.error(f"'{key}' must be a directory path", p.line_of(doc, key))
                value = None
            dirs[key] = (base / value) if value else None
        p.fail()

        topo = Topology(
            layout=layout,
            function=function,
            shard_count=count,
            schema_format=schema_format,
            hosts=hosts,
            path=self.path,
            templates_dir=dirs["templates"],
            migrations_dir=dirs["migrations"],
            routing_key=routing.get("key"),
            string_hash=routing.get("strings", "md5"),
            modulus=routing.get("modulus") or count,
            new_objects=new_objects,
            global_host=global_host,
            lint=lint,
            adoption=adoption,
        )
        if layout.uses_sign_bit:
            message = (
                f"the {layout.name} layout uses all 64 bits: its IDs turn negative on "
                f"{iso(layout.negative_at)} (and overflow on {iso(layout.overflow_at)})"
            )
            topo.warnings.append(message)
            # once per process: a Router reloads its file after every move
            if message not in _WARNED:
                _WARNED.add(message)
                warnings.warn(message, LayoutWarning, stacklevel=_outside_shardctl())
        return topo


# ---- sections: each is given the document and where to report, and returns its values -----------
def id_section(p: Problems, doc: Any) -> tuple[Layout, str]:
    """``id:``: the layout (with its epoch and, for ``custom``, its bits) and the ID function."""
    section = p.mapping(doc, "id", ID_KEYS)
    fallback = by_name("instagram", parse_epoch("2026-01-01T00:00:00Z"))
    if section is None:
        return fallback, "plpgsql"
    name = section.get("layout", "instagram")
    if name not in MINTABLE:
        hint = (
            " (decode-only: use it with decode-id --layout)"
            if name in ("pinterest", "snowflake")
            else ""
        )
        p.error(
            f"id.layout must be one of {', '.join(MINTABLE)}, got {echo(name)}{hint}",
            p.line_of(section, "layout"),
        )
        return fallback, "plpgsql"
    function = section.get("function", "plpgsql")
    if function not in FUNCTIONS:
        p.error(
            f"id.function must be one of {', '.join(FUNCTIONS)}, got {echo(function)}",
            p.line_of(section, "function"),
        )
        function = "plpgsql"
    epoch_ms = _epoch(p, doc, section)
    if epoch_ms is None:
        return fallback, function
    bits = section.get("bits")
    if name == "custom":
        return _custom_layout(p, section, epoch_ms) or fallback, function
    if bits is not None:
        p.error("id.bits is only for layout: custom", p.line_of(section, "bits"))
    return by_name(name, epoch_ms), function


def _epoch(p: Problems, doc: Any, section: Any) -> int | None:
    """``id.epoch`` in milliseconds, or None after a problem."""
    if "epoch" not in section:
        p.error('id.epoch is required (e.g. "2026-01-01T00:00:00Z")', p.line_of(doc, "id"))
        return None
    raw_epoch = section["epoch"]
    line = p.line_of(section, "epoch")
    try:
        epoch_ms = parse_epoch(raw_epoch)
    except ValueError as exc:
        p.error(f"id.epoch: {exc}", line)
        return None
    now_ms = int(datetime.now(timezone.utc).timestamp() * 1000)
    if epoch_ms < 0:
        p.error(f"id.epoch {raw_epoch!s} is before 1970-01-01", line)
        return None
    if epoch_ms > now_ms:
        p.error(f"id.epoch {raw_epoch!s} is in the future (IDs would start negative)", line)
        return None
    return epoch_ms


def _custom_layout(p: Problems, section: Any, epoch_ms: int) -> Layout | None:
    """The ``custom`` layout from ``id.bits``, or None after a problem."""
    bits = section.get("bits")
    if not isinstance(bits, dict):
        p.error(
            "id.layout custom needs id.bits: {time: 41, shard: 12, sequence: 10}",
            p.line_of(section, "bits") or p.line_of(section, "layout"),
        )
        return None
    p.unknown_keys(bits, BITS_KEYS, "id.bits")
    missing = BITS_KEYS - set(bits)
    if missing:
        p.error(f"id.bits is missing {', '.join(sorted(missing))}", p.line_of(section, "bits"))
        return None
    try:
        return by_name("custom", epoch_ms, dict(bits))
    except ConfigError as exc:
        p.error(exc.problem, p.line_of(section, "bits"))
        return None


def shards_section(p: Problems, doc: Any, layout: Layout) -> tuple[int, str]:
    """``shards:``: the count (0 when unusable) and the schema name format."""
    section = p.mapping(doc, "shards", SHARDS_KEYS)
    if section is None:
        return 0, "insta{n}"
    count = section.get("count")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        p.error(
            f"shards.count must be a positive integer, got {echo(count)}",
            p.line_of(section, "count") or p.line_of(doc, "shards"),
        )
        count = 0
    elif count > layout.max_shards:
        p.error(
            f"shards.count {count} does not fit the {layout.name} layout's "
            f"{layout.bits('shard')} shard bits (at most {layout.max_shards})",
            p.line_of(section, "count"),
        )
        count = 0
    elif count > yaml_guard.MAX_SHARDS:
        p.error(
            f"shards.count {count} is more than shardctl handles ({yaml_guard.MAX_SHARDS})",
            p.line_of(section, "count"),
        )
        count = 0
    fmt = section.get("schema", "insta{n}")
    line = p.line_of(section, "schema")
    if not isinstance(fmt, str):
        p.error(f'shards.schema must be a string like "insta{{n}}", got {echo(fmt)}', line)
        return count, "insta{n}"
    problem = _check_schema_format(fmt)
    if problem:
        p.error(problem, line)
        return count, "insta{n}"
    problem = _schema_names_problem(fmt, count)
    if problem:
        p.error(problem, line)
    return count, fmt


def routing_section(p: Problems, doc: Any, count: int) -> dict:
    """``routing:`` as given, with an unusable ``modulus`` set to None."""
    section = p.mapping(doc, "routing", ROUTING_KEYS, required=False)
    if section is None:
        return {}
    out = dict(section)
    strings = section.get("strings", "md5")
    if strings not in STRING_HASHES:
        p.error(
            f"routing.strings must be one of {', '.join(STRING_HASHES)}, got {echo(strings)}",
            p.line_of(section, "strings"),
        )
    modulus = section.get("modulus")
    if modulus is not None and (
        isinstance(modulus, bool)
        or not isinstance(modulus, int)
        or modulus < 1
        or (count and modulus > count)
    ):
        p.error(
            f"routing.modulus must be an integer from 1 to shards.count ({count}), got {echo(modulus)}",
            p.line_of(section, "modulus"),
        )
        out["modulus"] = None
    key = section.get("key")
    if key is not None and not isinstance(key, str):
        p.error(f"routing.key must be a column name, got {echo(key)}", p.line_of(section, "key"))
    return out


def placement_section(p: Problems, doc: Any, range_limit: int) -> list[int] | None:
    """``placement.new_objects`` (shards below ``range_limit``), or None."""
    section = p.mapping(doc, "placement", PLACEMENT_KEYS, required=False)
    if section is None or "new_objects" not in section:
        return None
    try:
        return parse_shards(section["new_objects"], limit=range_limit)
    except ValueError as exc:
        p.error(f"placement.new_objects: {exc}", p.line_of(section, "new_objects"))
        return None


def global_host_setting(p: Problems, doc: Any, hosts: list[Host]) -> str | None:
    """``placement.global_host``: the name of one of the hosts, or None."""
    section = doc.get("placement") if isinstance(doc, dict) else None
    if not isinstance(section, dict) or "global_host" not in section:
        return None
    name = section["global_host"]
    names = [h.name for h in hosts]
    if not isinstance(name, str) or (names and name not in names):
        p.error(
            f"placement.global_host must name a host ({', '.join(names)}), got {echo(name)}",
            p.line_of(section, "global_host"),
        )
        return None
    return name


def lint_section(p: Problems, doc: Any) -> dict[str, Any]:
    """``lint:``: squawk rules to skip (``exclude``) or turn on (``include``), and ``pg_version``."""
    section = p.mapping(doc, "lint", LINT_KEYS, required=False)
    if section is None:
        return {}
    out: dict[str, Any] = {}
    for key in ("exclude", "include"):
        rules = section.get(key, [])
        if not isinstance(rules, list) or not all(
            isinstance(r, str) and re.fullmatch(r"[a-z0-9-]+", r) for r in rules
        ):
            p.error(
                f"lint.{key} must be a list of squawk rule names (e.g. [prefer-bigint-over-int])",
                p.line_of(section, key),
            )
            continue
        out[key] = list(rules)
    version = section.get("pg_version")
    if version is not None:
        if isinstance(version, bool) or not re.fullmatch(r"\d+(\.\d+)?", str(version)):
            p.error(
                f"lint.pg_version must be a PostgreSQL version such as 16 or 16.4, got {echo(version)}",
                p.line_of(section, "pg_version"),
            )
        else:
            out["pg_version"] = str(version)
    return out
