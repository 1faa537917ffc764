"""``shardctl migrations import --from FORMAT DIR``: another tool's history as shardctl migrations.

Each up migration becomes ``V<n>__<original name>.sql`` in the tool's own order, numbered after the
target folder's last version. On the way, by PostgreSQL's parser:

* transaction control (``BEGIN``/``COMMIT`` that golang-migrate files often hold) is taken out:
  shardctl runs each shard's migration in a transaction with its ledger row;
* ``CREATE EXTENSION`` moves to a host-level migration (``H<n>__<original name>_extensions.sql``):
  extensions belong to the host database, not to one shard;
* a statement that cannot run in a transaction (``CREATE INDEX CONCURRENTLY``…) gets a file of its
  own marked ``-- shardctl:no-transaction``; the statements around it keep theirs (``_part2``…);
* text holding Jinja markers (``{{``, ``{%``, ``{#``) is kept literal with ``{% raw %}``.

Then every file is checked as ``migrate`` would check it and linted (``sql.lint.lint``); the
findings and a summary of what must change before the first ``init`` come back in the result.
Nothing is written on an error (BadInput, exit 2), nor with ``dry_run``.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import BadInput
from ..model.topology import Topology
from ..sql.host_migrations import HostLevelMigration, load_host
from ..sql.importers import History, SourceMigration, read_history
from ..sql.lint import Finding, lint
from ..sql.migrations import NO_TRANSACTION, Migration, SqlSyntaxError, Statement, load, parse

JINJA_MARKERS = ("{{", "{%", "{#")
SEARCH_PATH_NOTE = (
    "SET search_path kept: remove it, shard migrations run with search_path = <shard>, public "
    "(anything it points elsewhere lands outside the shard)"
)


@dataclass
class ImportedFile:
    source: str  # the original migration's name
    name: str  # the file written
    text: str
    host_level: bool = False
    transactional: bool = True
    notes: list[str] = field(default_factory=list)


@dataclass
class ImportResult:
    format: str
    source_dir: str
    target_dir: str
    files: list[ImportedFile] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    must_change: list[str] = field(default_factory=list)
    written: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return True  # a history that cannot be imported raises BadInput instead

    def raise_for_status(self) -> ImportResult:
        return self

    def to_dict(self) -> dict:
        return {
            "command": "migrations import",
            "ok": True,
            "format": self.format,
            "source": self.source_dir,
            "target": self.target_dir,
            "written": self.written,
            "seconds": round(self.seconds, 3),
            "files": [
                {
                    "from": f.source,
                    "to": f.name,
                    "host_level": f.host_level,
                    "transactional": f.transactional,
                    "notes": f.notes,
                }
                for f in self.files
            ],
            "skipped": self.skipped,
            "findings": [asdict(f) for f in self.findings],
            "must_change": self.must_change,
        }


def description_of(name: str) -> str:
    """An original name as a shardctl description: runs of other characters become one underscore."""
    return re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_") or "migration"


def _statements(m: SourceMigration) -> list[Statement]:
    try:
        return parse(m.up, tree=True)
    except SqlSyntaxError as exc:
        raise BadInput(
            f"{m.name}: line {exc.line + m.first_line - 1} does not parse as PostgreSQL: {exc.message}"
        ) from None


def _literal(text: str) -> str:
    if any(marker in text for marker in JINJA_MARKERS):
        return "{% raw %}\n" + text.rstrip("\n") + "\n{% endraw %}\n"
    return text


def _join(statements: list[tuple[str, Statement]]) -> str:
    """Statements with the comments that stood before each (``(comments, statement)``)."""
    out = "".join(lead + s.sql.rstrip().rstrip(";") + ";\n\n" for lead, s in statements).rstrip(
        "\n"
    )
    return out + "\n"


def _comments(text: str) -> str:
    """The comment text of what stands between two statements (a licence header, a note), as lines
    ending in a newline; '' when it holds only whitespace and the previous statement's semicolon."""
    text = text.lstrip().removeprefix(";").strip("\n").rstrip()
    return text.strip("\n") + "\n" if text.strip() else ""


def _leads(source: str, statements: list[Statement]) -> tuple[list[str], str]:
    """Each statement's leading comments in ``source`` (the text between it and the statement before),
    and the comments after the last one: a split file keeps them."""
    leads, pos = [], 0
    for s in statements:
        start = source.find(s.sql, pos)
        if start < 0:  # cannot place it: keep the statement, lose nothing else
            leads.append("")
            continue
        leads.append(_comments(source[pos:start]))
        pos = start + len(s.sql)
    return leads, _comments(source[pos:])


# Each tool's own ledger table: shardctl keeps its own (shardctl.migrations), so a statement on the old
# tool's is left out, and one it cannot take out (inside a DO block or a function) is refused.
LEDGER_TABLES = {
    "golang-migrate": "schema_migrations",
    "dbmate": "schema_migrations",
    "goose": "goose_db_version",
    "flyway": "flyway_schema_history",
    "prisma": "_prisma_migrations",
}


def _on_ledger(fmt: str, m: SourceMigration, s: Statement) -> bool:
    """Whether ``s`` acts on ``fmt``'s own ledger table (BadInput when it names it where the import
    cannot take it out)."""
    table = LEDGER_TABLES.get(fmt)
    if table is None or table not in s.sql.lower():
        return False
    if any(node.get("relname", "").lower() == table for node in _range_vars(s.node)):
        return True
    raise BadInput(
        f"{m.name}: names {fmt}'s own ledger table {table} where the import cannot take it out "
        f"({s.sql.split()[0].upper()} …): shardctl keeps its own ledger; remove that part and import again"
    )


def _range_vars(node: object) -> list[dict]:
    """Every relation a parse tree (pglast JSON) names: the dicts with a ``relname``."""
    if isinstance(node, dict):
        found = [node] if isinstance(node.get("relname"), str) else []
        return found + [r for v in node.values() for r in _range_vars(v)]
    if isinstance(node, list):
        return [r for v in node for r in _range_vars(v)]
    return []


def convert(
    fmt: str, m: SourceMigration
) -> tuple[list[tuple[str, bool, str, list[str]]], list[str]]:
    """One source migration as pieces (description suffix, transactional, SQL, notes) of shard files,
    and the CREATE EXTENSION statements it held (for the host-level file). Comments stay with the
    statement they stood before (a file's header with its first piece)."""
    statements = _statements(m)
    notes = list(m.notes)
    control = [s for s in statements if s.transaction_control]
    if control:
        notes.append(
            f"{', '.join(sorted({s.sql.split()[0].upper() for s in control}))} taken out: shardctl "
            f"runs each shard's migration in a transaction with its ledger row"
        )
    extensions = [s for s in statements if s.kind == "CreateExtensionStmt"]
    ledger = [s for s in statements if _on_ledger(fmt, m, s)]
    if ledger:
        notes.append(
            f"{len(ledger)} statement(s) on {fmt}'s own ledger table {LEDGER_TABLES[fmt]} taken out: "
            f"shardctl keeps its own ledger (shardctl.migrations)"
        )
    if any(s.kind == "VariableSetStmt" and s.node.get("name") == "search_path" for s in statements):
        notes.append(SEARCH_PATH_NOTE)
    if extensions:
        notes.append(f"{len(extensions)} CREATE EXTENSION moved to a host-level migration")
    dropped = {id(s) for s in control + extensions + ledger}
    if not m.transactional and not any(
        s.no_transaction for s in statements if id(s) not in dropped
    ):
        notes.append(
            f"{fmt} ran it outside a transaction; nothing in it needs that, so shardctl runs it in one"
        )
    if not dropped and not any(s.no_transaction for s in statements):
        return [("", True, m.up, notes)], []
    leads, tail = _leads(m.up, statements)
    groups: list[tuple[bool, list[tuple[str, Statement]]]] = []
    carried = ""  # the comments of a statement taken out go with the next one kept
    for lead, s in zip(leads, statements):
        if id(s) in dropped:
            carried += lead
            continue
        item = (carried + lead, s)
        carried = ""
        if s.no_transaction:
            groups.append((False, [item]))
        elif groups and groups[-1][0]:
            groups[-1][1].append(item)
        else:
            groups.append((True, [item]))
    if len(groups) > 1:
        notes.append(
            f"split into {len(groups)} files: a statement that cannot run in a transaction runs alone"
        )
    pieces = [
        [
            "" if i == 0 else f"_part{i + 1}",
            transactional,
            _join(group),
            notes if i == 0 else [],
        ]
        for i, (transactional, group) in enumerate(groups)
    ]
    if pieces and (carried + tail).strip():
        pieces[-1][2] += "\n" + carried + tail
    return [tuple(p) for p in pieces] or [  # type: ignore[misc]
        ("", True, (carried + tail) + "-- (nothing left to run: " + "; ".join(notes) + ")\n", notes)
    ], [s.sql for s in extensions]


def _file_text(fmt: str, source: str, transactional: bool, sql_text: str, notes: list[str]) -> str:
    header = [NO_TRANSACTION] if not transactional else []
    header.append(f"-- imported from {fmt}: {source}")
    header += [f"-- import: {n}" for n in notes]
    return "\n".join(header) + "\n" + _literal(sql_text)


def _existing(target: Path) -> tuple[list[Migration], list[HostLevelMigration]]:
    if not target.exists():
        return [], []
    if not target.is_dir():
        raise BadInput(f"--to {target}: not a directory")
    return load(target), load_host(target)


def plan(fmt: str, history: History, target: Path) -> list[ImportedFile]:
    """The files to write: shard migrations numbered after the target's last version, host-level
    migrations (the moved CREATE EXTENSIONs) after its last H file."""
    shard_files, host_files = _existing(target)
    done = {m.description.replace(" ", "_") for m in shard_files}
    already = [m.name for m in history.migrations if description_of(m.name) in done]
    if already:
        raise BadInput(
            f"--to {target} already holds {already[0]} (imported before?): import into an empty folder "
            f"or remove those files"
        )
    version, host_version = len(shard_files), len(host_files)
    width = max(4, len(str(version + 2 * len(history.migrations))))
    out: list[ImportedFile] = []
    for m in history.migrations:
        pieces, extensions = convert(fmt, m)
        if extensions:
            host_version += 1
            text = (
                f"-- imported from {fmt}: {m.name} (its CREATE EXTENSION statements)\n"
                + "".join(e.rstrip().rstrip(";") + ";\n" for e in extensions)
            )
            out.append(
                ImportedFile(
                    m.name,
                    f"H{host_version:0{width}d}__{description_of(m.name)}_extensions.sql",
                    text,
                    host_level=True,
                )
            )
        for suffix, transactional, sql_text, notes in pieces:
            version += 1
            name = f"V{version:0{width}d}__{description_of(m.name)}{suffix}.sql"
            out.append(
                ImportedFile(
                    m.name,
                    name,
                    _file_text(fmt, m.name, transactional, sql_text, notes),
                    transactional=transactional,
                    notes=notes,
                )
            )
    clash = [f.name for f in out if (target / f.name).exists()]
    if clash:
        raise BadInput(f"--to {target} already has {clash[0]}")
    return out


def _check_and_lint(topo: Topology, target: Path, files: list[ImportedFile]) -> list[Finding]:
    """Each file as migrate checks it (BadInput names it), then squawk's and shardctl's lint rules."""
    shard_files, number = [], re.compile(r"[VH]([0-9]+)__")
    for f in files:
        cls = HostLevelMigration if f.host_level else Migration
        m = cls(int(number.match(f.name).group(1)), f.name, target / f.name, f.text)
        m.sql(topo, topo.hosts[0].name if f.host_level else 0)
        if not f.host_level:
            shard_files.append(m)
    return lint(topo, shard_files, 0).findings if shard_files else []


def summary(result: ImportResult) -> list[str]:
    """What must change before the first ``init``: lint findings by rule, skipped files, moved extensions."""
    by_rule: dict[str, list[Finding]] = defaultdict(list)
    for f in result.findings:
        by_rule[f.rule].append(f)
    lines = []
    # what leaves shards silently wrong first, then by how often
    for rule, found in sorted(
        by_rule.items(), key=lambda item: (not item[1][0].silently_wrong, -len(item[1]))
    ):
        files = sorted({f.file for f in found})
        shown = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
        mark = "silently wrong: " if found[0].silently_wrong else ""
        lines.append(f"{mark}{rule}: {len(found)} finding(s) in {shown} ({found[0].message})")
    lines += [f"skipped {s}" for s in result.skipped]
    ledger = [f.name for f in result.files if any("own ledger table" in n for n in f.notes)]
    if ledger:
        lines.append(
            f"statements on the old tool's own ledger table taken out of {', '.join(ledger)}: "
            f"shardctl keeps its own ledger; check nothing else relies on that table"
        )
    paths = [f.name for f in result.files if SEARCH_PATH_NOTE in f.notes]
    if paths:
        silent = sum(1 for line in lines if line.startswith("silently wrong: "))
        lines.insert(
            silent,
            f"silently wrong: SET search_path in {', '.join(paths)}: remove it (shard migrations run "
            f"with search_path = <shard>, public)",
        )
    hosts = [f.name for f in result.files if f.host_level]
    if hosts:
        lines.append(
            f"CREATE EXTENSION moved to {', '.join(hosts)}: extensions install into public, which every "
            f"shard's search_path holds after the shard's own schema; check any schema-qualified use"
        )
    return lines


def import_history(
    topo: Topology, fmt: str, source: Path, target: Path | None = None, *, dry_run: bool = False
) -> ImportResult:
    """Read, convert, check and lint a history; write it into ``target`` (default: the topology's
    migrations folder) unless ``dry_run``. BadInput (nothing written) on bad input."""
    started = time.perf_counter()
    if target is None:
        if topo.migrations_dir is None:
            raise BadInput("the topology names no migrations folder: give --to DIR")
        target = topo.migrations_dir
    history = read_history(fmt, Path(source))
    result = ImportResult(fmt, str(source), str(target), skipped=history.skipped)
    result.files = plan(fmt, history, Path(target))
    result.findings = _check_and_lint(topo, Path(target), result.files)
    result.must_change = summary(result)
    if not dry_run:
        _write(Path(target), result.files)
        result.written = True
    result.seconds = time.perf_counter() - started
    return result


def _write(target: Path, files: list[ImportedFile]) -> None:
    written: list[Path] = []
    try:
        target.mkdir(parents=True, exist_ok=True)
        for f in files:
            path = target / f.name
            with open(path, "x", encoding="utf-8") as out:  # "x": never overwrite
                out.write(f.text)
            written.append(path)
    except OSError as exc:
        for path in written:
            path.unlink(missing_ok=True)
        raise BadInput(f"cannot write into {target}: {exc}") from None
