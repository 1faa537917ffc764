"""One truth for every command: status, plan, verify and migrate --check report a host that cannot
authenticate, shards missing and versions mixed across hosts with the same exit code and the same
one-line cause naming the fix (ops/health.py)."""

from __future__ import annotations

import json

import pytest
from support.fleet import connect, load, run_cli

# command, the word its error line starts with
COMMANDS = [
    (("status",), "status"),
    (("plan",), "plan"),
    (("verify",), "verify"),
    (("migrate", "--check"), "migrate"),
]
V3 = "ALTER TABLE {{ schema|ident }}.photos ADD COLUMN place text;\n"


def error_line(result) -> str:
    lines = [
        ln for ln in result.stderr.splitlines() if ln.strip() and not ln.startswith("warning:")
    ]
    assert len(lines) == 1 and lines[0].startswith("error: "), result
    assert "Traceback" not in result.stderr, result
    return lines[0].removeprefix("error: ")


def every_command(path, env: dict | None = None) -> dict[str, tuple[int, str, dict]]:
    """Each command's exit code, error line (without its command) and --json document."""
    out = {}
    for args, word in COMMANDS:
        human = run_cli(*args, config=path, env=env)
        doc = run_cli(*args, "--json", config=path, env=env)
        line = error_line(human) if human.exit_code else ""
        out[" ".join(args)] = (
            human.exit_code,
            line.removeprefix(f"{word}: "),
            json.loads(doc.stdout),
        )
        assert doc.exit_code == human.exit_code, (args, doc)
    return out


def assert_one_truth(found: dict, code: int, line: str) -> None:
    for command, (exit_code, said, doc) in found.items():
        assert (exit_code, said) == (code, line), (command, exit_code, said)
        assert doc["ok"] is False and doc["exit_code"] == code, (command, doc)


@pytest.fixture
def level(make_fleet):
    return make_fleet(hosts=2, shards=8, init=True)  # pg1: 0-3, pg2: 4-7


def test_a_lagging_host_is_named_as_lagging_by_every_command(level):
    """A host that missed a migrate (down, or left out) lags: every command names it and the
    migration it lacks, exit 4, and verify does not call its shards different schemas."""
    (level.parent / "migrations" / "V0003__photo_place.sql").write_text(V3)
    partial = run_cli("migrate", "--hosts", "pg1", config=level)
    assert partial.exit_code == 0, partial

    found = every_command(level)
    assert_one_truth(
        found,
        4,
        "pg2: V0003__photo_place.sql pending on shards 4-7 while other shards are at V3 "
        "(run shardctl migrate)",
    )
    verify_doc = found["verify"][2]
    assert verify_doc["violations"] == [], verify_doc  # no shard "differs from the majority"
    status_doc = found["status"][2]
    assert [h["drift"] for h in status_doc["hosts"]] == [False, True]
    assert status_doc["hosts"][1]["lagging"] == "V0003__photo_place.sql pending on shards 4-7"

    assert run_cli("migrate", config=level).exit_code == 0
    for args, _ in COMMANDS:
        assert run_cli(*args, config=level).exit_code == 0, args


def test_missing_shards_say_run_init_in_every_command(level):
    topo = load(level)
    with connect(topo, "pg1", autocommit=True) as conn:
        conn.execute("DROP SCHEMA insta2 CASCADE")  # recorded, but its schema is gone
    assert_one_truth(every_command(level), 4, "pg1: shards 2 missing (run shardctl init)")
    assert run_cli("init", config=level).exit_code == 0
    for args, _ in COMMANDS:
        assert run_cli(*args, config=level).exit_code == 0, args


def test_a_uniformly_pending_fleet_is_healthy_and_only_check_fails(level):
    """Every shard one version behind the files is work pending, not a sick fleet."""
    (level.parent / "migrations" / "V0003__photo_place.sql").write_text(V3)
    codes = {" ".join(args): run_cli(*args, config=level).exit_code for args, _ in COMMANDS}
    assert codes == {"status": 0, "plan": 0, "verify": 0, "migrate --check": 1}, codes


PASSWORD = "Tr0th-secret-51c2"


def test_a_host_that_cannot_authenticate_is_one_truth(private_sandbox, monkeypatch):
    """pg2's password_env unset, then its password refused: exit 3 from every command, and the line
    names the variable to set. init and migrate say the same and change nothing on pg2."""
    monkeypatch.setenv("SHARDCTL_TRUTH_PW", PASSWORD)
    box = private_sandbox(hosts=2, shards=8, password_env="SHARDCTL_TRUTH_PW")
    path = box.topology_path
    text = path.read_text()
    first = text.index("password_env: SHARDCTL_TRUTH_PW")
    second = text.index("password_env: SHARDCTL_TRUTH_PW", first + 1)
    path.write_text(text[:second] + text[second:].replace("SHARDCTL_TRUTH_PW", "PG2_PASSWORD", 1))
    monkeypatch.setenv("PG2_PASSWORD", PASSWORD)
    assert run_cli("init", config=path).exit_code == 0

    monkeypatch.delenv("PG2_PASSWORD")
    unset = (
        "host pg2 is unreachable: cannot authenticate: password_env PG2_PASSWORD is not set "
        "(set PG2_PASSWORD)"
    )
    assert_one_truth(every_command(path), 3, unset)
    pg2 = json.loads(run_cli("status", "--json", config=path).stdout)["hosts"][1]
    assert pg2["reachable"] is False and pg2["error"].endswith("(set PG2_PASSWORD)")
    for args in (("init",), ("migrate",)):
        changed = run_cli(*args, config=path)
        assert (changed.exit_code, error_line(changed)) == (3, unset), (args, changed)

    monkeypatch.setenv("PG2_PASSWORD", "not-" + PASSWORD)
    refused = (
        "host pg2 is unreachable: cannot authenticate: password authentication failed for user "
        '"postgres" (set PG2_PASSWORD to the role\'s password)'
    )
    found = every_command(path)
    assert_one_truth(found, 3, refused)
    assert not any(PASSWORD in json.dumps(doc) for _, _, doc in found.values())
