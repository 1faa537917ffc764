"""The per-table checksums a move compares between hosts (sql/catalog.checksums)."""

from __future__ import annotations

from support.fleet import connect, load

from shardctl.ops.move import transfer


def test_rows_hash_by_column_and_fall_back_to_text(make_fleet):
    topo = load(make_fleet(hosts=2, shards=2))
    tables = [("a", "hashable"), ("b", "hashable"), ("a", "plain"), ("b", "plain")]
    for host in ("pg1", "pg2"):
        with connect(topo, host, autocommit=True) as conn:
            for schema in ("a", "b"):
                conn.execute(f"CREATE SCHEMA {schema}")
                conn.execute(
                    f"CREATE TABLE {schema}.hashable (id bigint PRIMARY KEY, caption text, "
                    f"at timestamptz, tags int[], doc jsonb)"
                )
                conn.execute(
                    f"CREATE TABLE {schema}.plain (id bigint PRIMARY KEY, spot point, doc json)"
                )
                conn.execute(
                    f"INSERT INTO {schema}.hashable SELECT g, md5(g::text), '2026-01-01'::timestamptz + "
                    f"g * interval '1 s', ARRAY[g, g + 1], jsonb_build_object('g', g) "
                    f"FROM generate_series(1, 500) g"
                )
                conn.execute(
                    f"INSERT INTO {schema}.plain SELECT g, point(g, -g), json_build_object('g', g) "
                    f"FROM generate_series(1, 300) g"
                )
    with connect(topo, "pg1", autocommit=True) as one, connect(topo, "pg2") as two:
        first = transfer.checksums(one, tables)
        with two.transaction():  # inside a snapshot transaction, as the move's checks run it
            two.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            second = transfer.checksums(two, tables)
        assert first == second
        assert first[("a", "hashable")][0] == 500 and first[("a", "hashable")][1].startswith("r")
        assert first[("a", "plain")][0] == 300 and first[("a", "plain")][1].startswith(
            "t"
        )  # point: no hash
        assert first[("a", "hashable")] == first[("b", "hashable")]
        two.execute("UPDATE b.hashable SET caption = caption || 'x' WHERE id = 7")
        two.execute("UPDATE b.plain SET spot = point(0, 0) WHERE id = 9")
        two.commit()
        changed = transfer.checksums(two, tables)
        assert changed[("b", "hashable")] != first[("b", "hashable")]
        assert changed[("b", "plain")] != first[("b", "plain")]
        assert changed[("a", "hashable")] == first[("a", "hashable")]
