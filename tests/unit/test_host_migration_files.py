"""Host-level migration files (``H0001__…sql``) offline: naming, ordering, rendering, checksums."""

from __future__ import annotations

import pytest

from shardctl.errors import BadInput, ConfigError
from shardctl.model.topology import Topology
from shardctl.sql.host_migrations import load_host
from shardctl.sql.migrations import load, refusal

TOPOLOGY = (
    'version: 1\nid:\n  layout: instagram\n  epoch: "2026-01-01T00:00:00Z"\nshards:\n  count: 4\n'
    '  schema: "insta{n}"\nmigrations: migrations/\nhosts:\n  - name: pg1\n'
    '    dsn: "postgresql://postgres@127.0.0.1:1/x"\n    shards: "0-3"\n'
)


def folder(tmp_path, files: dict[str, str]):
    d = tmp_path / "migrations"
    d.mkdir()
    for name, text in files.items():
        (d / name).write_text(text)
    (tmp_path / "shardctl.yaml").write_text(TOPOLOGY)
    return d


def test_h_files_sit_beside_v_files_and_are_counted_apart(tmp_path):
    d = folder(
        tmp_path,
        {
            "V0001__a.sql": "SELECT 1;\n",
            "H0001__extensions.sql": "CREATE EXTENSION x;\n",
            "H0002__roles.sql": "SELECT 2;\n",
            "V0002__b.sql": "SELECT 3;\n",
        },
    )
    assert [m.name for m in load(d)] == ["V0001__a.sql", "V0002__b.sql"]
    assert [(m.version, m.description) for m in load_host(d)] == [(1, "extensions"), (2, "roles")]
    assert refusal("H0001__x.sql") is None
    assert refusal("h0001__x.sql") == "a host-level migration must start with an uppercase H"
    assert "or H, for a host-level migration" in refusal("X0001__x.sql")


def test_gaps_and_duplicates_are_refused(tmp_path):
    d = folder(tmp_path, {"H0001__a.sql": "SELECT 1;\n", "H0003__c.sql": "SELECT 1;\n"})
    with pytest.raises(ConfigError, match="expected H2, found H0003__c.sql"):
        load_host(d)
    (d / "H0002__b.sql").write_text("SELECT 1;\n")
    (d / "H02__again.sql").write_text("SELECT 1;\n")
    with pytest.raises(ConfigError, match="version 2 is used twice"):
        load_host(d)


def test_render_context_checks_and_checksum(tmp_path):
    d = folder(
        tmp_path,
        {
            "H0001__ext.sql": "CREATE EXTENSION IF NOT EXISTS vector SCHEMA {{ ext_schema }}; -- {{ host }}\n",
            "H0002__typo.sql": "SELECT {{ hots }};\n",
            "H0003__two.sql": "-- shardctl:no-transaction\nVACUUM;\nVACUUM;\n",
        },
    )
    topo = Topology.load(tmp_path / "shardctl.yaml")
    ext, typo, two = load_host(d)
    assert ext.sql(topo, "pg1") == "CREATE EXTENSION IF NOT EXISTS vector SCHEMA public; -- pg1\n"
    # The checksum is the file's source: the same on every host.
    assert ext.host_checksum() == load_host(d)[0].host_checksum() and len(ext.host_checksum()) == 64
    with pytest.raises(
        BadInput,
        match="host-level migration H0002__typo.sql:1 does not render: 'hots' is undefined",
    ):
        typo.sql(topo, "pg1")
    with pytest.raises(BadInput, match="holds 2 statements"):
        two.sql(topo, "pg1")
