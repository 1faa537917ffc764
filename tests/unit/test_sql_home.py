"""SQL lives in ``shardctl/sql/`` only: no Python string elsewhere in ``shardctl/`` holds SQL.

Every string literal (plain, f-string or bytes; docstrings aside) of every module outside
``shardctl/sql/`` is checked: one that starts like a statement (SELECT, INSERT INTO, SET … TO, BEGIN,
DEALLOCATE …) and has a statement's shape (PostgreSQL's parser takes it, with ``{}``/``%s`` holes
filled, or it has a clause keyword or a ``;``) is SQL. Log and error messages that start with a
keyword ("CREATE EXTENSION moved to …") are prose: the parser refuses them and they hold no clause.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from pglast import parser as pg_parser

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "shardctl"
SQL_HOME = PACKAGE / "sql"

# (file, the string's start) → why it may stay where it is.
EXEMPT = {
    ("shardctl/dev/demo.py", "INSERT INTO users"): (
        "the demo plays an application writing its own tables through the Router: an app's statements"
    ),
    ("shardctl/dev/demo.py", "INSERT INTO photos"): (
        "the demo plays an application writing its own tables through the Router: an app's statements"
    ),
    (
        "shardctl/dev/pooler.py",
        "SHOW VERSION",
    ): "PgBouncer's admin console command, not PostgreSQL's SQL",
    (
        "shardctl/dev/pooler.py",
        "SHOW POOLS",
    ): "PgBouncer's admin console command, not PostgreSQL's SQL",
    ("shardctl/django/management/commands/shardctl_makemigrations.py", "BEGIN;"): (
        "matches the lines of Django's sqlmigrate output that it drops; nothing is sent"
    ),
    ("shardctl/django/management/commands/shardctl_makemigrations.py", "COMMIT;"): (
        "matches the lines of Django's sqlmigrate output that it drops; nothing is sent"
    ),
}

_STARTS = re.compile(
    r"""^\s*\(?\s*(?:
        SELECT\s | SELECT$ | INSERT\s+INTO\s | UPDATE\s+\S+\s+(?:AS\s+\w+\s+)?SET\s | DELETE\s+FROM\s
      | (?:CREATE|ALTER|DROP|COMMENT\s+ON)\s+(?:OR\s+REPLACE\s+|UNIQUE\s+|TEMP(?:ORARY)?\s+|UNLOGGED\s+)*
          (?:TABLE|INDEX|SCHEMA|FUNCTION|PROCEDURE|VIEW|MATERIALIZED|SEQUENCE|ROLE|USER|DATABASE|EXTENSION
            |TRIGGER|PUBLICATION|SUBSCRIPTION|TYPE|DOMAIN|SYSTEM|DEFAULT\s+PRIVILEGES|COLUMN)\b
      | WITH\s+(?:RECURSIVE\s+)?\w+(?:\s*\([^)]*\))?\s+AS\s+(?:NOT\s+)?(?:MATERIALIZED\s+)?\(
      | SET\s+(?:LOCAL\s+|SESSION\s+)?[\w."{}]+\s*(?:TO|=)\s | SET\s+(?:SESSION\s+)?(?:ROLE|TRANSACTION)\b
      | RESET\s+[\w.*]+ | DISCARD\s+(?:ALL|PLANS|TEMP|SEQUENCES)\b
      | BEGIN(?:\s+(?:ISOLATION|READ|TRANSACTION|WORK)\b|\s*;|\s*$) | START\s+TRANSACTION\b
      | (?:COMMIT|ROLLBACK|ABORT)(?:\s+(?:AND|PREPARED|TO)\b|\s*;|\s*$) | (?:SAVEPOINT|RELEASE\s+SAVEPOINT)\s
      | GRANT\s+[\w ,]+\s+(?:ON|TO)\s | REVOKE\s+[\w ,]+\s+(?:ON|FROM)\s
      | TRUNCATE\s+(?:TABLE\s+)?\S | COPY\s+\S+(?:\s*\([^)]*\))?\s+(?:TO|FROM)\s | LOCK\s+(?:TABLE\s+)?\S
      | DO\s+(?:LANGUAGE\s+\w+\s+)?(?:\$|') | (?:LISTEN|UNLISTEN|NOTIFY)\s+\S | PREPARE\s+\w+
      | DEALLOCATE\s | EXPLAIN\s | (?:VACUUM|ANALYZE|REINDEX|CLUSTER)\b | SHOW\s+\w+\s*;?\s*$
      | VALUES\s*\( | CALL\s+\S+\(
    )""",
    re.VERBOSE,
)
_CLAUSE = re.compile(
    r"\b(FROM|WHERE|VALUES|RETURNING|INTO|SET|TABLE|AS|ON|TO|ALL|LEVEL)\b|;\s*(?:$|[A-Z])"
)
_HOLE = re.compile(r"\{[^{}]*\}|%\([a-z_]+\)s|%s")


def _parses(text: str) -> bool:
    try:
        pg_parser.parse_sql(_HOLE.sub("x", text).replace("%%", "%"))
    except Exception:  # noqa: BLE001 - pglast raises its own ParseError
        return False
    return True


def looks_like_sql(text: str) -> bool:
    return bool(_STARTS.match(text)) and (_parses(text) or bool(_CLAUSE.search(text)))


def sql_strings(source: str) -> list[tuple[int, str]]:
    """(line, text) of the string literals of ``source`` that hold SQL (docstrings aside); an
    f-string's replacement fields read as ``{}``."""
    tree = ast.parse(source)
    docs = {
        id(n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Expr) and isinstance(n.value, (ast.Constant, ast.JoinedStr))
    }
    found, inner = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            inner |= {id(v) for v in node.values}
            text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
            if id(node) not in docs and looks_like_sql(text):
                found.append((node.lineno, text))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or id(node) in docs | inner:
            continue
        value = node.value
        text = value.decode(errors="replace") if isinstance(value, bytes) else value
        if isinstance(text, str) and looks_like_sql(text):
            found.append((node.lineno, text))
    return sorted(found)


def _scan() -> tuple[list[str], set[tuple[str, str]]]:
    problems, used = [], set()
    for path in sorted(PACKAGE.rglob("*.py")):
        if SQL_HOME in path.parents:
            continue
        rel = path.relative_to(ROOT).as_posix()
        for line, text in sql_strings(path.read_text()):
            exemption = next((k for k in EXEMPT if k[0] == rel and text.startswith(k[1])), None)
            if exemption:
                used.add(exemption)
            else:
                problems.append(f"{rel}:{line}: {text.strip()[:80]!r}")
    return problems, used


def test_no_sql_outside_the_sql_package():
    problems, used = _scan()
    assert not problems, (
        "SQL outside shardctl/sql/ (move it there, or list an exemption with its reason):\n"
        + "\n".join(problems)
    )
    assert used == set(EXEMPT), f"exemptions that no longer match anything: {set(EXEMPT) - used}"


@pytest.mark.parametrize(
    "source",
    [
        'Q = "SELECT id FROM t WHERE x = %s"',
        'conn.execute("SELECT pg_backend_pid()")',
        'conn.execute(f"ALTER SCHEMA {a} RENAME TO {b};\\n")',
        'x = b"BEGIN READ ONLY"',
        'conn.execute("COMMIT")',
        'Q = """\n    WITH s AS (SELECT 1)\n    SELECT * FROM s"""',
        'conn.execute("SET search_path TO {}, public".format(s))',
        'conn.execute("RESET search_path")',
        'conn.execute(f"DEALLOCATE ALL /* plan epoch {n} */")',
        'conn.execute(f"LOCK TABLE {t} IN EXCLUSIVE MODE")',
        'conn.execute("INSERT INTO shardctl.events (kind) VALUES (%s)", (k,))',
        'conn.execute("DROP DATABASE IF EXISTS {} WITH (FORCE)")',
        'conn.execute("SHOW server_version")',
    ],
)
def test_a_sql_string_is_found(source):
    assert sql_strings(source), source


@pytest.mark.parametrize(
    "source",
    [
        'raise BadInput(f"CREATE EXTENSION moved to {s}: extensions install into public")',
        'log.info("select a host to move shards to")',
        'msg = "BEGIN the move again with --resume"',
        'def f():\n    """SELECT * FROM t: a docstring may show SQL."""',
        'note = "Commit the topology file after the move"',
        'msg = f"set up {n} subscriptions"',
        'm = f"CREATE EXTENSION moved to {h}: extensions install into public; check any use"',
    ],
)
def test_prose_is_not_sql(source):
    assert not sql_strings(source), source


def test_the_scan_would_fail_on_a_stray_query(tmp_path, monkeypatch):
    """A module outside sql/ with a query makes the scan report it (the real test then fails)."""
    fake = tmp_path / "shardctl"
    (fake / "ops").mkdir(parents=True)
    (fake / "sql").mkdir()
    (fake / "ops" / "stray.py").write_text('Q = "SELECT shard_id FROM shardctl.shards"\n')
    (fake / "sql" / "home.py").write_text('Q = "SELECT shard_id FROM shardctl.shards"\n')
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    monkeypatch.setitem(globals(), "PACKAGE", fake)
    monkeypatch.setitem(globals(), "SQL_HOME", fake / "sql")
    problems, _ = _scan()
    assert problems == ["shardctl/ops/stray.py:1: 'SELECT shard_id FROM shardctl.shards'"]


QUERY_FILES = sorted((SQL_HOME / "queries").glob("*.sql"))


def test_there_are_query_files():
    assert len(QUERY_FILES) >= 5


@pytest.mark.parametrize("path", QUERY_FILES, ids=lambda p: p.stem)
def test_a_query_file_loads_and_parses(path):
    """Each file parses as PostgreSQL, as psql would send it (its ``:'name'`` variables filled in), its
    header says how to run it in psql, and load() gives psycopg's placeholders for its variables."""
    from shardctl.sql import queries

    text = path.read_text()
    variables = set(re.findall(r":'(\w+)'", text))
    header = "\n".join(line for line in text.splitlines() if line.startswith("--"))
    assert text.startswith("-- ") and "In psql" in header, f"{path.name}: no header on running it"
    for name in variables:
        assert f"\\set {name} " in header, f"{path.name}: the header does not \\set {name}"
    assert _parses(re.sub(r":'(\w+)'", "'{}'", text))
    loaded = queries.load(path.stem)
    assert not loaded.endswith(";") and set(re.findall(r"%\((\w+)\)s", loaded)) == variables


def test_the_fingerprint_leaves_out_the_guard_trigger():
    """fingerprint_objects.sql names the move's guard trigger as text: it must be GUARD_TRIGGER's."""
    from shardctl.sql import queries
    from shardctl.sql.catalog.control import GUARD_TRIGGER

    assert f"g.tgname <> '{GUARD_TRIGGER}'" in queries.load("fingerprint_objects")
