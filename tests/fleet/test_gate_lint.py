"""The pull-request gate (``migrate --check --base DIR``) runs shardctl's schema-per-shard lint rules."""

from __future__ import annotations

import json
import shutil

from support.fleet import connect, load, run_cli

DO_BLOCK = """DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'photos_caption_user_uniq') THEN
        ALTER TABLE {{ schema|ident }}.photos ADD CONSTRAINT photos_caption_user_uniq UNIQUE (user_id, caption);
    END IF;
END
$$;
"""


def test_gate_fails_on_a_catalog_lookup_without_schema_and_passes_the_fixed_one(make_fleet):
    path = make_fleet(hosts=2, shards=8, init=True)
    base = path.parent / "base"
    shutil.copytree(path.parent / "migrations", base)
    new = path.parent / "migrations" / "V0003__caption_unique.sql"
    new.write_text(DO_BLOCK)

    bad = run_cli("migrate", "--check", "--base", str(base), config=path)
    assert bad.exit_code == 1, bad
    errors = [ln for ln in bad.stderr.splitlines() if ln.startswith("error: ")]
    assert errors == [
        (
            "error: gate: V0003__caption_unique.sql:3 shard-catalog-lookup-no-schema: lookup in "
            "pg_constraint by conname with no schema filter: on every shard it finds the first shard's "
            "object (fix: filter by the shard's schema too: AND connamespace = {{ schema|literal }}"
            "::regnamespace, AND schemaname = {{ schema|literal }}, or look the object up as "
            "{{ schema|literal }}::regnamespace)"
        )
    ], bad
    doc = json.loads(
        run_cli("migrate", "--check", "--base", str(base), "--json", config=path).stdout
    )
    assert doc["ok"] is False and doc["new"] == ["V0003__caption_unique.sql"]

    new.write_text(
        DO_BLOCK.replace(
            "WHERE conname", "WHERE connamespace = {{ schema|literal }}::regnamespace AND conname"
        )
    )
    good = run_cli("migrate", "--check", "--base", str(base), config=path)
    assert good.exit_code == 0 and "Gate passed" in good.stdout, good

    # An exclusion in the topology's lint: section lets the first form through the gate too.
    new.write_text(DO_BLOCK)
    path.write_text(path.read_text() + "lint:\n  exclude: [shard-catalog-lookup-no-schema]\n")
    assert run_cli("migrate", "--check", "--base", str(base), config=path).exit_code == 0

    topo = load(path)
    with connect(topo, "pg1") as conn:  # the gate touched nothing
        assert conn.execute("SELECT max(version) FROM shardctl.migrations").fetchone()[0] == 2
