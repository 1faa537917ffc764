"""The topology's ``adoption:`` section: what it holds, every validation rule (one line, exit 2), and
the file edits the copy and the cutover make (written, flipped, source dropped) under the file lock."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from shardctl.cli import cli
from shardctl.errors import BadInput, ConfigErrors
from shardctl.ids.old_ids import id_floor
from shardctl.model.adoption import AdoptedTable, Adoption, IdMap, tables_from_plan
from shardctl.model.layouts import parse_epoch
from shardctl.model.topology import Topology
from shardctl.model.topology_file import drop_adoption_source, flip_adoption, write_adoption

GOOD = """\
version: 1
id:
  layout: custom
  bits: {time: 41, shard: 13, sequence: 9}
  epoch: "2011-01-01T00:00:00Z"
shards:
  count: 8
hosts:
  - name: pg1
    dsn: "postgresql://app@127.0.0.1:1/app"
    shards: "0-3"
  - name: pg2
    dsn: "host=127.0.0.1 port=1 dbname=app2 user=app"
    shards: "4-7"
routing:
  key: user_id
"""


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), start=1) if needle in line)


def check_bad(tmp_path, text: str, needle: str, line: int | None = None) -> str:
    """``shardctl info`` exits 2 with ``path:LINE: problem`` (one line) and the API refuses it too."""
    path = tmp_path / "shardctl.yaml"
    path.write_text(text)
    result = CliRunner().invoke(cli, ["--config", str(path), "info"])
    assert result.exit_code == 2, result.output
    assert result.stdout == "" and needle in result.stderr, result.stderr
    if line is not None:
        assert f"{path}:{line}: " in result.stderr, result.stderr
    with pytest.raises(ConfigErrors):
        Topology.load(path)
    return result.stderr


ADOPTION = """\
adoption:
  source: {dsn: "postgresql://app@127.0.0.1:1/old", password_env: OLD_PASSWORD, pooler: session}
  schema: public
  authoritative: source
  id_floor: 1837461283764
  tables:
    users: {id: id, key: id}
    posts: {id: id, key: user_id}
    likes: {key: user_id}
  globals: [plans, countries]
  id_map: {host: pg2, dbname: app_ids}
"""


def test_adoption_section_loads():
    topo = Topology.from_text(GOOD + ADOPTION)
    a = topo.adoption
    assert a is not None and a.on_source and a.schema == "public"
    assert (a.source.name, a.source.dsn, a.source.password_env, a.source.pooler) == (
        "source",
        "postgresql://app@127.0.0.1:1/old",
        "OLD_PASSWORD",
        "session",
    )
    assert a.source.shards == []  # the source owns no shard of the fleet: init/migrate ignore it
    assert a.tables == {
        "users": AdoptedTable("users", "id", "id"),
        "posts": AdoptedTable("posts", "id", "user_id"),
        "likes": AdoptedTable("likes", None, "user_id"),
    }
    assert a.tables["users"].root and not a.tables["posts"].root
    assert a.globals == ("plans", "countries") and a.id_map == IdMap("pg2", "app_ids")
    assert a.is_old_id(1837461283763) and not a.is_old_id(1837461283764)
    assert Topology.from_text(GOOD).adoption is None


def test_adoption_without_source_after_cleanup():
    text = GOOD + ADOPTION.replace("authoritative: source", "authoritative: fleet")
    text = "\n".join(line for line in text.splitlines() if "source: {" not in line) + "\n"
    a = Topology.from_text(text).adoption
    assert a.source is None and not a.on_source


@pytest.mark.parametrize(
    "old, new, needle, marker",
    [
        (
            "authoritative: source",
            "authoritative: old",
            "adoption.authoritative must be source or fleet",
            "authoritative: old",
        ),
        (
            "id_floor: 1837461283764",
            "id_floor: -5",
            "adoption.id_floor must be a positive integer",
            "id_floor:",
        ),
        (
            "id_floor: 1837461283764",
            "id_floor: 9223372036854775808",
            "adoption.id_floor must be a positive integer",
            "id_floor:",
        ),
        (
            "schema: public",
            "schema: [a]",
            "adoption.schema must be a schema name",
            "schema: [a]",
        ),
        (
            "users: {id: id, key: id}",
            "users: {id: id, key: 7}",
            "adoption.tables.users.key",
            "users: {",
        ),
        ("users: {id: id, key: id}", "users: {id: id}", "adoption.tables.users.key", "users: {"),
        (
            "users: {id: id, key: id}",
            "users: {id: id, key: id, kind: root}",
            "unknown key 'kind' in adoption.tables.users",
            "users: {",
        ),
        (
            "globals: [plans, countries]",
            "globals: [plans, posts]",
            "posts is also in adoption.tables",
            "globals:",
        ),
        (
            "id_map: {host: pg2, dbname: app_ids}",
            "id_map: {host: pg9, dbname: app_ids}",
            "adoption.id_map.host must name a host (pg1, pg2)",
            "id_map:",
        ),
        (
            "id_map: {host: pg2, dbname: app_ids}",
            "id_map: {host: pg2}",
            "adoption.id_map.dbname",
            "id_map:",
        ),
        (
            'source: {dsn: "postgresql://app@127.0.0.1:1/old"',
            'source: {dsn: "postgresql://app:secret@127.0.0.1:1/old"',
            "adoption.source: dsn contains a literal password",
            "source: {",
        ),
        (
            'source: {dsn: "postgresql://app@127.0.0.1:1/old"',
            'source: {dsn: "postgresql://app@127.0.0.1:1/old", shards: "0-3"',
            "unknown key 'shards' in source",
            "source: {",
        ),
        (
            "  schema: public\n",
            "  schema: public\n  copy: yes\n",
            "unknown key 'copy' in adoption",
            "copy: yes",
        ),
    ],
)
def test_adoption_problems_exit_2_with_their_line(tmp_path, old, new, needle, marker):
    text = GOOD + ADOPTION.replace(old, new)
    err = check_bad(tmp_path, text, needle, line=line_of(text, marker))
    assert len(err.strip().splitlines()) == 1, err  # one line


def test_no_fleet_host_may_be_named_source(tmp_path):
    text = (GOOD + ADOPTION).replace("name: pg2", "name: source").replace("host: pg2", "host: pg1")
    check_bad(tmp_path, text, "a host is named source, the name the adopted old database goes by")


def test_source_authoritative_needs_a_source(tmp_path):
    text = GOOD + "\n".join(l for l in ADOPTION.splitlines() if "source: {" not in l) + "\n"
    check_bad(tmp_path, text, "adoption.authoritative is source but adoption names no source")


def test_tables_from_plan():
    plan = {
        "tables": [
            {"name": "users", "kind": "root", "key": "id", "id_column": "id"},
            {"name": "posts", "kind": "column", "key": "user_id", "id_column": "id"},
            {"name": "likes", "kind": "column", "key": "user_id", "id_column": None},
            {"name": "plans", "kind": "global", "key": None, "id_column": "id"},
            {"name": "django_migrations", "kind": "history", "key": None, "id_column": "id"},
        ]
    }
    tables, globals_ = tables_from_plan(plan)
    assert list(tables) == ["users", "posts", "likes"] and globals_ == ("plans",)
    assert tables["users"].root and tables["likes"].id is None


def test_id_floor_is_the_first_id_at_that_millisecond():
    topo = Topology.from_text(GOOD)
    at = parse_epoch("2026-11-27T12:00:00Z")
    floor = id_floor(topo.layout, at)
    assert floor == (at - topo.layout.epoch_ms) << 22
    assert topo.layout.decode(floor)["unix_ms"] == at
    assert topo.layout.decode(floor - 1)["unix_ms"] == at - 1  # one below: the millisecond before


def test_write_flip_and_drop_round_trip(tmp_path):
    path = tmp_path / "shardctl.yaml"
    path.write_text("# our fleet\n" + GOOD)
    topo = Topology.from_text(GOOD + ADOPTION)
    written = write_adoption(path, topo.adoption)
    assert written.adoption == topo.adoption
    text = path.read_text()
    assert text.startswith("# our fleet\n") and "    users: {id: id, key: id}\n" in text
    assert Topology.load(path).adoption == topo.adoption
    assert flip_adoption(path, "fleet") is True
    assert flip_adoption(path, "fleet") is False
    assert Topology.load(path).adoption.authoritative == "fleet"
    assert flip_adoption(path, "source") is True  # --abort
    with pytest.raises(BadInput, match="cut over before cleanup"):
        drop_adoption_source(path)
    flip_adoption(path, "fleet")
    assert drop_adoption_source(path) is True
    after = Topology.load(path).adoption
    assert after.source is None and after.tables == topo.adoption.tables
    assert (after.id_floor, after.id_map) == (topo.adoption.id_floor, topo.adoption.id_map)
    with pytest.raises(BadInput, match="no way back"):
        flip_adoption(path, "source")


def test_write_adoption_validates_before_writing(tmp_path):
    path = tmp_path / "shardctl.yaml"
    path.write_text(GOOD)
    bad = Adoption(
        source=None, authoritative="source", id_floor=5, tables={"u": AdoptedTable("u", "id", "id")}
    )
    with pytest.raises(ConfigErrors):
        write_adoption(path, bad)
    assert path.read_text() == GOOD


def decode(tmp_path, text: str, *args: str):
    path = tmp_path / "shardctl.yaml"
    path.write_text(text)
    result = CliRunner().invoke(cli, ["--config", str(path), *args])
    return result


def test_decode_id_says_an_old_id_is_a_pre_adoption_id(tmp_path):
    text = GOOD + ADOPTION
    topo = Topology.from_text(text)
    new = topo.layout.encode(unix_ms=parse_epoch("2026-11-27T12:00:00Z"), shard=5, sequence=3)
    assert new >= topo.adoption.id_floor
    r = decode(tmp_path, text, "decode-id", "42", str(new), "--json")
    assert r.exit_code == 0, r.output
    old, fresh = json.loads(r.stdout)["ids"]
    assert old["pre_adoption"] is True and old["id_floor"] == 1837461283764
    assert "pre-adoption ID (below the ID floor 1837461283764)" in old["note"]
    assert (old["host"], old["schema"], old["shard"]) == ("source", "public", None)
    assert (fresh["shard"], fresh["host"], fresh["note"]) == (5, "pg2", "")  # decoded by its bits
    # the root table: its old ID is its key
    r = decode(tmp_path, text, "decode-id", "42", "--table", "users", "--json")
    doc = json.loads(r.stdout)["ids"][0]
    assert (doc["shard"], doc["host"], doc["table"]) == (42 % 8, "source", "users")
    after = text.replace("authoritative: source", "authoritative: fleet")
    r = decode(tmp_path, after, "decode-id", "42", "--table", "users", "--json")
    doc = json.loads(r.stdout)["ids"][0]
    assert (doc["shard"], doc["schema"], doc["host"]) == (2, "insta2", "pg1")
    r = decode(tmp_path, after, "decode-id", "42", "--table", "users")  # the table, with a note
    assert r.exit_code == 0 and "pre-adoption ID" in r.stdout and "insta2" in r.stdout
    r = decode(tmp_path, after, "decode-id", "42", "--table", "users", "--csv")
    assert r.stdout.splitlines()[0].endswith(",schema,host,note")
    assert r.stdout.splitlines()[1].startswith("42,")
    r = decode(tmp_path, after, "decode-id", "42", "--table", "nope")
    assert r.exit_code == 2 and "--table nope is not an adopted sharded table" in r.stderr
    r = decode(tmp_path, GOOD, "decode-id", "42", "--table", "users")
    assert r.exit_code == 2 and "no adoption section" in r.stderr


def test_locate_goes_to_the_source_while_it_is_authoritative(tmp_path):
    r = decode(tmp_path, GOOD + ADOPTION, "locate", "42", "--json")
    assert (json.loads(r.stdout)["host"], json.loads(r.stdout)["schema"]) == ("source", "public")
    after = (GOOD + ADOPTION).replace("authoritative: source", "authoritative: fleet")
    r = decode(tmp_path, after, "locate", "42", "--json")
    assert (json.loads(r.stdout)["host"], json.loads(r.stdout)["schema"]) == ("pg1", "insta2")


def test_write_adoption_from_the_section_keys_with_the_default_id_map(tmp_path):
    """What adopt copy writes: the section's keys as they are written; the id map's default place."""
    path = tmp_path / "shardctl.yaml"
    path.write_text(GOOD)
    topo = write_adoption(
        path,
        source={"dsn": "postgresql://app@127.0.0.1:1/old"},
        schema="public",
        authoritative="source",
        id_floor=1837461283764,
        tables={"users": {"id": "id", "key": "id"}, "likes": {"id": None, "key": "user_id"}},
        globals=["plans"],
    )
    a = topo.adoption
    assert a.id_map == IdMap("pg1", "shardctl_adopt_ids")  # no global_host: the first host
    assert a.tables["likes"] == AdoptedTable("likes", None, "user_id") and a.on_source
