"""Reading other tools' migration histories, in their own order: golang-migrate, goose, dbmate,
Flyway and Prisma. Pure file work: ``read_history`` returns each migration's *up* SQL with its
original name and transaction mode; ``ops.import_history`` numbers, checks, lints and writes them.

Every error is a BadInput (exit 2) naming the file: an unknown format, an empty or unreadable
folder, a file of the format's kind that its rules do not name, two files with one version.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import BadInput

FORMATS = ("golang-migrate", "goose", "dbmate", "flyway", "prisma")
IGNORED = {"readme", "readme.md", "readme.txt", ".gitkeep", ".keep", ".gitignore", ".ds_store"}


@dataclass
class SourceMigration:
    """One migration of the imported history, in the order its tool runs them."""

    name: str  # the original file (or Prisma folder) name, as the tool knows it
    up: str  # the SQL that migrates up (down sections dropped)
    transactional: bool = True  # False: the tool ran it outside a transaction
    notes: list[str] = field(default_factory=list)  # what the import changed or dropped
    first_line: int = 1  # the source file's line where ``up`` begins (for error messages)


@dataclass
class History:
    format: str
    migrations: list[SourceMigration] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # files left out, with why


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8").lstrip("\ufeff")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"cannot read {path.name}: {exc}") from None


def _numbered(
    paths: list[Path], pattern: re.Pattern, kind: str, skipped: list[str]
) -> list[tuple[tuple, Path, re.Match]]:
    """The files matching ``pattern`` (its group "v" is the version), sorted by version; other .sql
    files are refused by name, anything else skipped."""
    found, refused = [], []
    for path in sorted(paths):
        if path.name.lower() in IGNORED or path.is_dir():
            continue
        match = pattern.fullmatch(path.name)
        if match is None:
            if path.suffix.lower() == ".sql":
                refused.append(path.name)
            else:
                skipped.append(f"{path.name}: not a {kind} SQL migration")
            continue
        found.append((tuple(int(p) for p in re.split(r"[._]", match.group("v"))), path, match))
    if refused:
        raise BadInput(f"{', '.join(refused)}: not named as {kind} names migrations")
    found.sort(key=lambda item: item[0])
    return found


def _migration_files(
    paths: list[Path],
    pattern: re.Pattern,
    kind: str,
    skipped: list[str],
    keep: Callable[[re.Match], bool] = lambda _m: True,
) -> list[tuple[tuple, Path, re.Match]]:
    """The migrations among ``paths`` (:func:`_numbered`) whose name ``keep`` takes, each version
    used once."""
    items = [i for i in _numbered(paths, pattern, kind, skipped) if keep(i[2])]
    _no_duplicates(items, kind)
    return items


def _no_duplicates(items: list[tuple[tuple, Path, re.Match]], kind: str) -> None:
    seen: dict[tuple, str] = {}
    for version, path, _m in items:
        if version in seen and seen[version] != path.name:
            raise BadInput(
                f"{kind} version {'.'.join(map(str, version))} is used twice: {seen[version]} and "
                f"{path.name}"
            )
        seen[version] = path.name


def _golang_migrate(directory: Path, history: History) -> None:
    ups = _migration_files(
        list(directory.iterdir()),
        re.compile(r"(?P<v>[0-9]+)_(?P<d>.+)\.(?P<dir>up|down)\.sql"),
        "golang-migrate",
        history.skipped,
        keep=lambda match: match.group("dir") == "up",
    )
    for _v, path, match in ups:
        stem = path.name[: -len(".up.sql")]
        m = SourceMigration(stem, _read(path))
        down = path.with_name(f"{stem}.down.sql")
        if down.exists():
            m.notes.append(f"down migration {down.name} dropped")
        history.migrations.append(m)


# goose's and dbmate's file names: <version>_<description>.sql
SEQUENTIAL = re.compile(r"(?P<v>[0-9]+)_(?P<d>.+)\.sql")
ANNOTATION = re.compile(r"--\s*\+goose\s+(.*)", re.IGNORECASE)


def _goose_sections(text: str, name: str) -> SourceMigration:
    """Split a goose file: the lines after ``-- +goose Up`` up to ``-- +goose Down``."""
    m = SourceMigration(name, "")
    lines, section, seen_up = [], None, False
    for number, line in enumerate(text.splitlines(), start=1):
        note = ANNOTATION.match(line)
        word = note.group(1).strip().lower() if note else ""
        if word == "up":
            section, seen_up, m.first_line = "up", True, number + 1
        elif word == "down":
            section = "down"
            m.notes.append("-- +goose Down section dropped")
        elif word == "no transaction":
            m.transactional = False
        elif word in ("statementbegin", "statementend"):
            continue  # PostgreSQL's parser splits statements itself
        elif word.startswith("envsub"):
            m.notes.append(
                f"-- +goose {word} is not supported: ${{VAR}} references stay as written"
            )
        elif section == "up":
            lines.append(line)
    if not seen_up:
        raise BadInput(f"{name}.sql has no `-- +goose Up` annotation")
    m.up = "\n".join(lines).rstrip() + "\n"
    return m


def _goose(directory: Path, history: History) -> None:
    items = _migration_files(list(directory.iterdir()), SEQUENTIAL, "goose", history.skipped)
    gos = [s for s in history.skipped if s.split(":")[0].endswith(".go")]
    if gos:
        raise BadInput(
            f"goose Go migrations cannot be imported: {', '.join(s.split(':')[0] for s in gos)}; "
            f"rewrite them as SQL first"
        )
    for _v, path, _m in items:
        history.migrations.append(_goose_sections(_read(path), path.stem))


DBMATE_MARK = re.compile(r"--\s*migrate:(up|down)\b(.*)", re.IGNORECASE)


def _dbmate(directory: Path, history: History) -> None:
    items = _migration_files(list(directory.iterdir()), SEQUENTIAL, "dbmate", history.skipped)
    for _v, path, _m in items:
        m = SourceMigration(path.stem, "")
        lines, section = [], None
        for number, line in enumerate(_read(path).splitlines(), start=1):
            mark = DBMATE_MARK.match(line)
            if mark:
                section = mark.group(1).lower()
                m.first_line = number + 1 if section == "up" else m.first_line
                if (
                    section == "up"
                    and "transaction:false" in mark.group(2).replace(" ", "").lower()
                ):
                    m.transactional = False
                if section == "down":
                    m.notes.append("-- migrate:down section dropped")
            elif section == "up":
                lines.append(line)
        if section is None:
            raise BadInput(f"{path.name} has no `-- migrate:up` marker")
        m.up = "\n".join(lines).rstrip() + "\n"
        history.migrations.append(m)


def _flyway(directory: Path, history: History) -> None:
    rest = []
    for path in sorted(directory.iterdir()):
        if path.name.startswith("R__") and path.suffix == ".sql":
            history.skipped.append(
                f"{path.name}: Flyway repeatable migration (shardctl has none: make its final "
                f"state a versioned migration)"
            )
        elif re.fullmatch(r"[UB][0-9][0-9._]*__.+\.sql", path.name):
            history.skipped.append(
                f"{path.name}: Flyway undo/baseline migration (not a forward migration)"
            )
        else:
            rest.append(path)
    items = _migration_files(
        rest,
        re.compile(r"V(?P<v>[0-9]+(?:[._][0-9]+)*)__(?P<d>.+)\.sql"),
        "Flyway",
        history.skipped,
    )
    for _v, path, _m in items:
        text = _read(path)
        m = SourceMigration(path.stem, text)
        if "${" in text:
            m.notes.append("holds ${...}: Flyway placeholders are not replaced")
        history.migrations.append(m)


def _prisma(directory: Path, history: History) -> None:
    if (directory / "migrations").is_dir() and not (directory / "migration_lock.toml").exists():
        directory = directory / "migrations"  # given the prisma/ folder
    lock = directory / "migration_lock.toml"
    if lock.exists():
        provider = re.search(r'provider\s*=\s*"([^"]+)"', _read(lock))
        if provider and provider.group(1) not in ("postgresql", "postgres", "cockroachdb"):
            raise BadInput(f"{lock.name}: provider {provider.group(1)!r} is not PostgreSQL")
    folders = sorted(p for p in directory.iterdir() if p.is_dir())
    for folder in folders:
        if not re.fullmatch(r"[0-9]+_.+", folder.name):
            raise BadInput(
                f"{folder.name}: not named as Prisma names migrations (<timestamp>_<name>/)"
            )
        sql_file = folder / "migration.sql"
        if not sql_file.is_file():
            raise BadInput(f"{folder.name}/ has no migration.sql")
        history.migrations.append(SourceMigration(folder.name, _read(sql_file)))
    history.skipped += [
        f"{p.name}: not a Prisma migration folder"
        for p in directory.iterdir()
        if p.is_file() and p.name != lock.name and p.name.lower() not in IGNORED
    ]


READERS = {
    "golang-migrate": _golang_migrate,
    "goose": _goose,
    "dbmate": _dbmate,
    "flyway": _flyway,
    "prisma": _prisma,
}


def read_history(fmt: str, directory: Path) -> History:
    """The up migrations of ``directory`` in ``fmt``'s order (BadInput, one line, on bad input)."""
    if fmt not in READERS:
        raise BadInput(f"--from {fmt}: unknown format; choose one of {', '.join(FORMATS)}")
    directory = Path(directory)
    if not directory.is_dir():
        raise BadInput(f"{directory}: not a directory")
    try:
        next(directory.iterdir(), None)
    except OSError as exc:
        raise BadInput(f"{directory}: cannot be read ({exc.strerror})") from None
    history = History(fmt)
    READERS[fmt](directory, history)
    if not history.migrations:
        raise BadInput(f"{directory}: no {fmt} migrations found")
    return history
