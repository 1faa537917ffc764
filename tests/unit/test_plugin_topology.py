"""The pytest plugin writes its topology files with PyYAML: a DSN holding YAML's quote and comment
characters reads back as it was given."""

from __future__ import annotations

import yaml

from shardctl.testing import FleetServer, _topology_text, _with_databases


def test_a_dsn_with_quotes_and_hashes_reads_back_unchanged() -> None:
    dsn = 'postgresql://app@127.0.0.1:5432/{db}?application_name=say%20"hi"%20#1:%20it\\s'
    servers = [FleetServer("pg1", dsn, peer_format=dsn), FleetServer("pg2", dsn)]
    text = _with_databases(
        _topology_text(servers, 8, "plpgsql", "insta", "2026-01-01T00:00:00Z", None, None, "uid"),
        ["db_a", "db_b"],
    )
    doc = yaml.safe_load(text)
    assert [h["dsn"] for h in doc["hosts"]] == [dsn.format(db="db_a"), dsn.format(db="db_b")]
    assert doc["hosts"][0]["peer_dsn"] == dsn.format(db="db_a")
    assert [h["shards"] for h in doc["hosts"]] == ["0-3", "4-7"]
    assert doc["id"]["epoch"] == "2026-01-01T00:00:00Z"  # a string, as the topology wants it
    assert doc["routing"] == {"key": "uid"}
