"""Versioned per-shard migration files: discovery, ordering, rendering and checksums."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import jinja2

from .errors import BadInput, ConfigError
from .render import builtin_dir, shard_context, string_environment
from .topology import Topology

FILE_NAME = re.compile(r"^V(\d+)__([A-Za-z0-9_]+)\.sql$")
NO_TRANSACTION = "-- shardctl:no-transaction"


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

    def render(self, topo: Topology, shard: int) -> str:
        """The SQL for one shard. Undefined names fail here (StrictUndefined), before anything runs."""
        try:
            template = _compiled(self.source, str(self.path))
            return template.render(shard_context(topo, shard))
        except jinja2.TemplateError as exc:
            line = getattr(exc, "lineno", None)
            where = f"{self.name}:{line}" if line else self.name
            raise BadInput(f"migration {where} does not render: {exc.message or exc}") from None


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
