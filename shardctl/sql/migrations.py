"""Versioned per-shard migration files: discovery, ordering, rendering and checksums."""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from ..errors import BadInput, ConfigError, SqlSyntaxError
from ..model.topology import Topology
from .render import builtin_dir, render_errors, shard_context, string_environment, template_line

if TYPE_CHECKING:  # imported where SQL is parsed (parse()) or rendered: a command that does neither
    import jinja2  # (migrate --check with nothing pending) never pays for them
    from pglast import parser as pg_parser

FILE_NAME = re.compile(r"V([0-9]+)__([A-Za-z0-9_]+)\.sql", re.ASCII)  # ASCII: \d would take ٣ as 3
# Host-level migrations (run once per host database, before the shard migrations): sql/host_migrations.py.
HOST_FILE_NAME = re.compile(r"H([0-9]+)__([A-Za-z0-9_]+)\.sql", re.ASCII)
NO_TRANSACTION = "-- shardctl:no-transaction"
# Files a migrations folder may hold besides migrations (compared in lower case).
ALLOWED_FILES = {
    "readme",
    "readme.md",
    "readme.txt",
    "readme.rst",
    ".gitkeep",
    ".keep",
    ".gitignore",
    ".ds_store",
}
# The rendering context that goes into a ledger checksum: what identifies the shard and its IDs.
# A fixed list, so that adding a value to the rendering context later never changes existing checksums.
CHECKSUM_KEYS = ("schema", "shard_id", "next_id", "sequence")
CHECKSUM_LAYOUT_KEYS = ("name", "epoch_ms", "time_bits", "shard_bits", "sequence_bits")


@dataclass(frozen=True)
class Step:
    """One migration rendered for one shard, ready to run."""

    version: int
    description: str
    sql: str
    checksum: str
    transactional: bool = True


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    path: Path
    source: str

    @property
    def transactional(self) -> bool:
        first = self.source.lstrip("\ufeff").split("\n", 1)[0].strip().lower()
        return first != NO_TRANSACTION

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def source_digest(self) -> str:
        """The file's one digest: sha256 of its source, as the ledger checksum and the verified-versions
        cache hold it (host-level migrations record it as their checksum)."""
        return _source_digest(self.source)

    def render(self, topo: Topology, shard: int, context: dict | None = None) -> str:
        """The SQL for one shard. Undefined names fail here (StrictUndefined), before anything runs.

        ``context``: ``shard_context(topo, shard)`` when the caller already has it (rendering many
        versions for one shard)."""
        try:
            template = _compiled(self.source, str(self.path))
            text = template.render(context if context is not None else shard_context(topo, shard))
        # also Python errors from expressions, e.g. {{ shard_id + "x" }}
        except render_errors() as exc:
            line = template_line(exc, "<template>")
            where = f"{self.name}:{line}" if line else self.name
            raise BadInput(
                f"migration {where} does not render: {getattr(exc, 'message', None) or exc}"
            ) from None
        return text

    def sql(self, topo: Topology, shard: int, context: dict | None = None) -> str:
        """The SQL to run on one shard: rendered, then parsed by PostgreSQL's parser and checked
        (BadInput names the file, the shard and the line)."""
        text = self.render(topo, shard, context)
        self._check_statements(text, f"migration {self.name} (rendered for shard {shard})")
        return text

    def _check_statements(self, text: str, where: str) -> None:
        """Parse the rendered SQL (after Jinja, so what runs is what is checked) and refuse what could
        not run as shardctl runs it: a syntax error, transaction control, or a statement that cannot
        run in a transaction without the directive (or alongside others with it). ``where`` names the
        file and what it was rendered for."""
        try:
            statements = parse(text)
        except SqlSyntaxError as exc:
            raise BadInput(f"{where} line {exc.line} does not parse: {exc.message}") from None
        control = next((s for s in statements if s.transaction_control), None)
        if control is not None:
            raise BadInput(
                f"{where} holds {control.sql.split()[0].upper()}: shardctl runs each shard's migration "
                f"in a transaction of its own, with its ledger row; remove it"
            )
        if self.transactional:
            blocker = next((s for s in statements if s.no_transaction), None)
            if blocker is not None:
                raise BadInput(
                    f"{where} holds {blocker.no_transaction}, which cannot run inside a transaction: "
                    f"put `{NO_TRANSACTION}` on the file's first line, and keep that statement "
                    f"alone in its file"
                )
        elif len(statements) > 1:
            # Statements sent together run in one implicit transaction, where CREATE INDEX
            # CONCURRENTLY cannot; and a half-applied no-transaction file could not be re-run.
            raise BadInput(
                f"migration {self.name} is marked {NO_TRANSACTION} but holds {len(statements)} "
                f"statements; give each statement a migration file of its own"
            )

    def checksum_for(self, topo: Topology, shard: int, context: dict | None = None) -> str:
        """The ledger checksum: the file's source plus the values that identify the shard.

        Fleet-wide values that change over the fleet's life (``shard_count`` on add-shard, ``function``
        on a re-deploy) are left out, so growing the fleet never makes an applied file look edited.
        See docs/migrations.md."""
        ctx = context if context is not None else shard_context(topo, shard)
        layout = ctx["layout"]
        parts = (
            [self.source_digest]
            + [str(ctx[k]) for k in CHECKSUM_KEYS]
            + [str(layout.get(k)) for k in CHECKSUM_LAYOUT_KEYS]
        )
        return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()

    def matches(self, topo: Topology, shard: int, stored: str, context: dict | None = None) -> bool:
        """Whether a ledger checksum is this file's for ``shard``. Rows written before checksums left
        out fleet-wide values hold the checksum of the rendered SQL: those still match while it does."""
        if stored == self.checksum_for(topo, shard, context):
            return True
        try:
            return stored == checksum(self.render(topo, shard, context))
        except BadInput:
            return False


@functools.lru_cache(maxsize=4096)
def _source_digest(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


_templates: dict[tuple[str, str], jinja2.Template] = {}


def _compiled(source: str, name: str) -> jinja2.Template:
    key = (name, source)
    template = _templates.get(key)
    if template is None:
        import jinja2

        try:
            template = string_environment().from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise BadInput(
                f"migration {Path(name).name}:{exc.lineno} is not a valid template: {exc.message}"
            ) from None
        _templates[key] = template
    return template


# Statements PostgreSQL refuses inside a transaction block, by parse-tree node: a predicate on the
# node's fields says when (e.g. only with CONCURRENTLY).
def _has_option(node: dict, name: str) -> bool:
    return any(o.get("DefElem", {}).get("defname") == name for o in node.get("params", []) or [])


_NO_TRANSACTION: dict[str, tuple[str, Callable[[dict], bool]]] = {
    "IndexStmt": ("CREATE INDEX CONCURRENTLY", lambda n: bool(n.get("concurrent"))),
    "DropStmt": ("DROP INDEX CONCURRENTLY", lambda n: bool(n.get("concurrent"))),
    "ReindexStmt": ("REINDEX CONCURRENTLY", lambda n: _has_option(n, "concurrently")),
    "VacuumStmt": ("VACUUM", lambda n: bool(n.get("is_vacuumcmd"))),
    "AlterTableStmt": (
        "DETACH PARTITION CONCURRENTLY",
        lambda n: any(
            c.get("AlterTableCmd", {}).get("def", {}).get("PartitionCmd", {}).get("concurrent")
            for c in n.get("cmds", [])
        ),
    ),
    "CreatedbStmt": ("CREATE DATABASE", lambda n: True),
    "DropdbStmt": ("DROP DATABASE", lambda n: True),
    "AlterSystemStmt": ("ALTER SYSTEM", lambda n: True),
    "CreateTableSpaceStmt": ("CREATE TABLESPACE", lambda n: True),
    "DropTableSpaceStmt": ("DROP TABLESPACE", lambda n: True),
    "CreateSubscriptionStmt": ("CREATE SUBSCRIPTION", lambda n: True),
    "ClusterStmt": ("CLUSTER without a table", lambda n: "relation" not in n),
}


@dataclass(frozen=True)
class Statement:
    sql: str
    kind: str  # the parse-tree node, e.g. "IndexStmt" ("" when parse() did not build the tree)
    # what makes it refuse a transaction block, e.g. "CREATE INDEX CONCURRENTLY"
    no_transaction: str | None = None
    transaction_control: bool = False  # BEGIN, COMMIT, SAVEPOINT…
    # the parse tree (pglast JSON)
    node: dict = field(default_factory=dict, compare=False, repr=False)


# Words without which no statement needs its parse tree looked at (no-transaction statements and
# transaction control): text without any of them is only split, which costs a fraction of building
# the whole tree (the tree of a typical migration takes ~0.2 ms; splitting ~0.03 ms).
_TREE_WORDS = (
    "concurrently",
    "vacuum",
    "database",
    "system",
    "tablespace",
    "subscription",
    "cluster",
    "begin",
    "start",
    "commit",
    "end",
    "rollback",
    "abort",
    "savepoint",
    "release",
    "prepare",
)


def _syntax_error(exc: pg_parser.ParseError, sql_text: str) -> SqlSyntaxError:
    index = exc.args[1] if len(exc.args) > 1 and isinstance(exc.args[1], int) else 0
    return SqlSyntaxError(str(exc.args[0]), sql_text.count("\n", 0, index) + 1)


def parse(sql_text: str, *, tree: bool = False) -> list[Statement]:
    """The top-level statements of ``sql_text``, split and classified by PostgreSQL's own parser
    (libpg_query through pglast). Raises SqlSyntaxError (with the line) on text PostgreSQL would refuse.

    ``tree``: always keep each statement's parse tree (``node``, ``kind``); otherwise they are only
    built when the text holds a word that could make a statement refuse a transaction."""
    from pglast import parser as pg_parser

    lower = sql_text.lower()
    # substrings: at worst a needless tree
    if not tree and not any(word in lower for word in _TREE_WORDS):
        try:
            slices = pg_parser.split(sql_text, True, True)  # with the parser: a syntax error raises
        except pg_parser.ParseError as exc:
            raise _syntax_error(exc, sql_text) from None
        return [Statement(sql_text[piece].strip(), "") for piece in slices]
    try:
        doc = json.loads(pg_parser.parse_sql_json(sql_text))
    except pg_parser.ParseError as exc:
        raise _syntax_error(exc, sql_text) from None
    raw = sql_text.encode()
    out = []
    for item in doc.get("stmts", []):
        start = item.get("stmt_location", 0)
        length = item.get("stmt_len")
        text = raw[start : start + length if length else len(raw)].decode().strip()
        ((kind, node),) = item["stmt"].items()
        rule = _NO_TRANSACTION.get(kind)
        out.append(
            Statement(
                text,
                kind,
                rule[0] if rule and rule[1](node) else None,
                kind == "TransactionStmt",
                node,
            )
        )
    return out


def split_statements(sql_text: str) -> list[str]:
    """Top-level statements of ``sql_text``, by PostgreSQL's parser (no trailing semicolons; pieces
    holding only whitespace and comments are dropped)."""
    return [s.sql for s in parse(sql_text)]


def checksum(sql_text: str) -> str:
    return hashlib.sha256(sql_text.encode()).hexdigest()


def migrations_dir(topo: Topology | None) -> Path:
    return topo.migrations_dir if topo and topo.migrations_dir else builtin_dir("migrations")


def refusal(name: str) -> str | None:
    """Why a file in the migrations folder is not a migration (None: it is one, or an allowed README)."""
    if name.lower() in ALLOWED_FILES or FILE_NAME.fullmatch(name) or HOST_FILE_NAME.fullmatch(name):
        return None
    stem, dot, ext = name.rpartition(".")
    if dot and ext.lower() == "sql" and ext != "sql":
        return f"the extension must be lowercase .sql, not .{ext}"
    if not dot or ext != "sql":
        return "it is not a .sql file (only migrations and README files belong in the migrations folder)"
    if stem[:1] == "v":
        return "it must start with an uppercase V"
    if stem[:1] == "h":
        return "a host-level migration must start with an uppercase H"
    if stem[:1] not in ("V", "H"):
        return "it must start with V (or H, for a host-level migration) and the version"
    version, sep, description = stem[1:].partition("__")
    odd = next((c for c in version if c.isdigit() and c not in "0123456789"), None)
    if odd is not None:
        return f"the version must be written in ASCII digits 0-9 (found {odd!r})"
    if not sep:
        return "two underscores must separate the version from the description"
    if not version or not version.isascii() or not version.isdigit():
        return "the version must be a number right after the V"
    if not description:
        return "it has no description after the two underscores"
    return "the description may hold only ASCII letters, digits and underscores"


M = TypeVar("M", bound=Migration)


def read_files(directory: Path, file_name: re.Pattern[str], kind: type[M], what: str) -> list[M]:
    """The files of ``directory`` whose names ``file_name`` matches, read as ``kind`` and ordered by
    version; ``what`` names such a file in the error when one cannot be read."""
    if not directory.is_dir():
        raise ConfigError(f"migrations directory not found: {directory}")
    found: list[M] = []
    for path in sorted(directory.iterdir()):
        match = file_name.fullmatch(path.name)
        if match is None:
            continue
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read {what} {path.name}: {exc}") from None
        found.append(kind(int(match.group(1)), match.group(2).replace("_", " "), path, source))
    return sorted(found, key=lambda m: m.version)


def load(directory: Path) -> list[Migration]:
    """All migrations in ``directory``, ordered by version (host-level ones: host_migrations.load_host).

    Every file in the folder is a migration or refused by name (a README is allowed): a ConfigError
    names each refused file and why; likewise a duplicate version or a gap.
    """
    found = read_files(directory, FILE_NAME, Migration, "migration")
    refused = [
        f"migration file {path.name} is not named V<version>__<description>.sql: {why}"
        for path in sorted(directory.iterdir())
        if (why := refusal(path.name)) is not None
    ]
    if refused:
        raise ConfigError("; ".join(refused) + " (e.g. V0003__add_photo_location.sql)")
    return in_sequence(found, "migration", "version ")


def in_sequence(found: list[M], what: str, prefix: str) -> list[M]:
    """``found`` (ordered by version), once its versions run 1, 2, 3… with no version used twice;
    else a ConfigError naming the files (``prefix``: how the message writes an expected version)."""
    seen: dict[int, M] = {}
    for m in found:
        if m.version in seen:
            raise ConfigError(
                f"{what} version {m.version} is used twice: {seen[m.version].name} and {m.name}"
            )
        seen[m.version] = m
    for expected, m in enumerate(found, start=1):
        if m.version != expected:
            raise ConfigError(
                f"{what} versions must run 1, 2, 3… without gaps: expected {prefix}{expected}, "
                f"found {m.name}"
            )
    return found


def for_topology(topo: Topology) -> list[Migration]:
    return load(migrations_dir(topo))


def steps_for(
    migrations: list[Migration],
    topo: Topology,
    shard: int,
    above: int = 0,
    target: int | None = None,
) -> list[Step]:
    """Rendered migration steps for one shard, versions ``above < v <= target``."""
    out = []
    for m in migrations:
        if m.version <= above or (target is not None and m.version > target):
            continue
        text = m.sql(topo, shard)
        out.append(
            Step(m.version, m.description, text, m.checksum_for(topo, shard), m.transactional)
        )
    return out


# Statements that refuse a transaction only because of CONCURRENTLY: without it they run in one, with the
# same effect on an empty new shard (what the trial needs to know is whether the server accepts them).
_CONCURRENT_KINDS = ("IndexStmt", "DropStmt", "ReindexStmt", "AlterTableStmt")


def transactional_form(sql_text: str) -> str | None:
    """``sql_text`` (a rendered no-transaction migration) with CONCURRENTLY taken out of its statements,
    deparsed by pglast; None when a statement has no transactional form (VACUUM, CREATE DATABASE…)."""
    from pglast import ast, parse_sql
    from pglast.stream import RawStream

    out = []
    for statement in parse(sql_text, tree=True):
        if not statement.no_transaction:
            out.append(statement.sql)
            continue
        if statement.kind not in _CONCURRENT_KINDS:
            return None
        node = parse_sql(statement.sql)[0].stmt
        if isinstance(node, (ast.IndexStmt, ast.DropStmt)):
            node.concurrent = False
        elif isinstance(node, ast.ReindexStmt):
            node.params = tuple(p for p in node.params or () if p.defname != "concurrently") or None
        else:
            for cmd in node.cmds or ():
                if isinstance(cmd.def_, ast.PartitionCmd):
                    cmd.def_.concurrent = False
        out.append(RawStream()(node))
    return ";\n".join(out)
