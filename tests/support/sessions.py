"""Session-state statements a pooled connection must not keep: (statement, probe, the probe's clean value)."""

from __future__ import annotations

SESSION_STATEMENTS = [
    ("SELECT set_config('work_mem', '7MB', false)", "SHOW work_mem", "4MB"),
    (
        "SET statement_timeout = '4321ms'",
        "SELECT current_setting('statement_timeout') <> '4321ms'",
        True,
    ),
    (
        "CREATE TEMP TABLE users (id bigint, username text)",
        "SELECT to_regclass('pg_temp.users') IS NULL",
        True,
    ),
    (
        "SELECT pg_advisory_lock(4242)",
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()",
        0,
    ),
    ("LISTEN somewhere", "SELECT count(*) FROM pg_listening_channels()", 0),
    (
        "PREPARE mine AS SELECT 1",
        "SELECT count(*) FROM pg_prepared_statements WHERE name !~ '^_pg3_'",
        0,
    ),
]
