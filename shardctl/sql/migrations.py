"""Versioned per-shard migration files: discovery, ordering, rendering and checksums."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import jinja2

from ..errors import BadInput, ConfigError
from .render import RENDER_ERRORS, builtin_dir, shard_context, string_environment, template_line
from ..model.topology import Topology

FILE_NAME = re.compile(r"^V(\d+)__([A-Za-z0-9_]+)\.sql$")
NO_TRANSACTION = "-- shardctl:no-transaction"


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

    def render(self, topo: Topology, shard: int, context: dict | None = None) -> str:
        """The SQL for one shard. Undefined names fail here (StrictUndefined), before anything runs.

        ``context``: ``shard_context(topo, shard)`` when the caller already has it (rendering many
        versions for one shard)."""
        try:
            template = _compiled(self.source, str(self.path))
            text = template.render(context if context is not None else shard_context(topo, shard))
        except RENDER_ERRORS as exc:  # also Python errors from expressions, e.g. {{ shard_id + "x" }}
            line = template_line(exc, "<template>")
            where = f"{self.name}:{line}" if line else self.name
            raise BadInput(f"migration {where} does not render: {getattr(exc, 'message', None) or exc}") from None
        if not self.transactional:
            count = len(split_statements(text))
            if count > 1:
                # Statements sent together run in one implicit transaction, where CREATE INDEX
                # CONCURRENTLY cannot; and a half-applied no-transaction file could not be re-run.
                raise BadInput(f"migration {self.name} is marked {NO_TRANSACTION} but holds {count} statements; "
                               f"give each statement a migration file of its own")
        return text


_templates: dict[tuple[str, str], jinja2.Template] = {}


def _compiled(source: str, name: str) -> jinja2.Template:
    key = (name, source)
    template = _templates.get(key)
    if template is None:
        try:
            template = string_environment().from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise BadInput(f"migration {Path(name).name}:{exc.lineno} is not a valid template: {exc.message}") from None
        _templates[key] = template
    return template


_DOLLAR = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)?\$")


def split_statements(sql_text: str) -> list[str]:
    """Top-level statements of ``sql_text`` (semicolons inside quotes, dollar quotes and comments do
    not count); pieces holding only whitespace and comments are dropped."""
    out: list[str] = []
    start = i = 0
    n = len(sql_text)
    code = False  # the current piece has something besides whitespace and comments
    while i < n:
        c = sql_text[i]
        if c == "-" and sql_text.startswith("--", i):
            end = sql_text.find("\n", i)
            i = n if end < 0 else end + 1
            continue
        if c == "/" and sql_text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if sql_text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif sql_text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
            continue
        if c in "'\"":
            backslash = c == "'" and i > 0 and sql_text[i - 1] in "eE"
            i += 1
            while i < n:
                if backslash and sql_text[i] == "\\":
                    i += 2
                    continue
                if sql_text[i] == c:
                    if sql_text.startswith(c * 2, i):
                        i += 2
                        continue
                    break
                i += 1
            i += 1
            code = True
            continue
        if c == "$":
            m = _DOLLAR.match(sql_text, i)
            if m and not (i > 0 and (sql_text[i - 1].isalnum() or sql_text[i - 1] == "_")):
                end = sql_text.find(m.group(0), m.end())
                i = n if end < 0 else end + len(m.group(0))
                code = True
                continue
        if c == ";":
            if code:
                out.append(sql_text[start:i + 1].strip())
            start, code = i + 1, False
        elif not c.isspace():
            code = True
        i += 1
    if code:
        out.append(sql_text[start:].strip())
    return out


def checksum(sql_text: str) -> str:
    return hashlib.sha256(sql_text.encode()).hexdigest()


def migrations_dir(topo: Topology | None) -> Path:
    return topo.migrations_dir if topo and topo.migrations_dir else builtin_dir("migrations")


def load(directory: Path) -> list[Migration]:
    """All migrations in ``directory``, ordered by version.

    Raises ConfigError for a badly named ``.sql`` file, a duplicate version or a gap.
    """
    if not directory.is_dir():
        raise ConfigError(f"migrations directory not found: {directory}")
    found: list[Migration] = []
    for path in sorted(directory.iterdir()):
        if path.suffix != ".sql" or path.name.startswith("."):
            continue
        match = FILE_NAME.match(path.name)
        if not match:
            raise ConfigError(f"migration file {path.name} is not named V<version>__<description>.sql "
                              f"(e.g. V0003__add_photo_location.sql)")
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read migration {path.name}: {exc}") from None
        found.append(Migration(int(match.group(1)), match.group(2).replace("_", " "), path, source))
    found.sort(key=lambda m: m.version)
    seen: dict[int, Migration] = {}
    for m in found:
        if m.version in seen:
            raise ConfigError(f"migration version {m.version} is used twice: {seen[m.version].name} and {m.name}")
        seen[m.version] = m
    for expected, m in enumerate(found, start=1):
        if m.version != expected:
            raise ConfigError(f"migration versions must run 1, 2, 3… without gaps: expected version {expected}, "
                              f"found {m.name}")
    return found


def for_topology(topo: Topology) -> list[Migration]:
    return load(migrations_dir(topo))


def steps_for(migrations: list[Migration], topo: Topology, shard: int, above: int = 0,
              target: int | None = None) -> list[Step]:
    """Rendered migration steps for one shard, versions ``above < v <= target``."""
    out = []
    for m in migrations:
        if m.version <= above or (target is not None and m.version > target):
            continue
        text = m.render(topo, shard)
        out.append(Step(m.version, m.description, text, checksum(text), m.transactional))
    return out
