"""Adoption's pieces that need no server: the baseline's schema rewrite on PostgreSQL's tokens, and
the query classes read from pglast's parse tree (against tables described by hand)."""

from __future__ import annotations

import pytest

from shardctl.ops.adopt.blockers import table_blockers
from shardctl.ops.adopt.keys import classify as classify_tables
from shardctl.ops.adopt.queries import classify
from shardctl.sql.baseline import in_shard
from shardctl.sql.catalog.adopt import Column, Constraint, Table

S = "{{ schema|ident }}"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "FOREIGN KEY (a) REFERENCES public.users(id)",
            f"FOREIGN KEY (a) REFERENCES {S}.users(id)",
        ),
        ('public."TaskStatus"', f'{S}."TaskStatus"'),
        ('"public".t', f"{S}.t"),
        ("PUBLIC.t", f"{S}.t"),
        # a literal, a column named public, a qualifier of another schema: untouched
        ("CHECK (note <> 'public.x')", "CHECK (note <> 'public.x')"),
        ("CHECK (t.public > 0)", "CHECK (t.public > 0)"),
        ("other.public.f()", "other.public.f()"),
        ("DEFAULT 'a{{b'::text", "{% raw %}DEFAULT 'a{{b'::text{% endraw %}"),
    ],
)
def test_schema_rewrite_reads_tokens(text, expected):
    assert in_shard(text, "public") == expected


def _table(name, columns, constraints=()):
    return Table(
        name,
        "r",
        "p",
        "d",
        0,
        0,
        0,
        [
            Column(
                c,
                "bigint",
                True,
                None,
                "",
                "",
                None,
                f"public.{name}_{c}_seq" if c == "id" else None,
            )
            for c in columns
        ],
        list(constraints),
    )


def _fk(name, cols, ref, ref_cols):
    definition = f"FOREIGN KEY ({', '.join(cols)}) REFERENCES public.{ref}({', '.join(ref_cols)})"
    return Constraint(name, "f", cols, definition, ref, "public", ref_cols)


def _pk(name, cols):
    return Constraint(name, "p", cols, "")


TABLES = {
    "users": _table("users", ["id", "email"], [_pk("users_pkey", ["id"])]),
    "posts": _table(
        "posts",
        ["id", "user_id", "title"],
        [_pk("posts_pkey", ["id"]), _fk("posts_user", ["user_id"], "users", ["id"])],
    ),
    "comments": _table(
        "comments",
        ["id", "post_id", "body"],
        [_pk("comments_pkey", ["id"]), _fk("comments_post", ["post_id"], "posts", ["id"])],
    ),
    "likes": _table(
        "likes",
        ["user_id", "post_id"],
        [
            _pk("likes_pkey", ["user_id", "post_id"]),
            _fk("likes_post", ["post_id"], "posts", ["id"]),
        ],
    ),
    "countries": _table("countries", ["code", "name"]),
    # two references to the root: the first is the key, the other crosses shards
    "messages": _table(
        "messages",
        ["id", "sender_id", "recipient_id"],
        [
            _pk("messages_pkey", ["id"]),
            _fk("messages_sender", ["sender_id"], "users", ["id"]),
            _fk("messages_recipient", ["recipient_id"], "users", ["id"]),
        ],
    ),
}
PLANS = classify_tables(TABLES, "public", "user_id", "users", "id")


@pytest.mark.parametrize(
    ("sql", "cls"),
    [
        ("SELECT * FROM posts WHERE user_id = $1", "single-shard"),
        ("SELECT * FROM posts WHERE id = $1::bigint AND title = $2", "single-shard"),
        ("SELECT * FROM comments WHERE post_id = $1", "single-shard"),  # the parent's ID
        ("SELECT * FROM posts WHERE user_id = $1 OR title = $2", "fan-out"),  # OR pins nothing
        ("SELECT * FROM posts WHERE user_id IN ($1, $2)", "multi-shard"),
        ("SELECT * FROM posts WHERE title LIKE $1", "fan-out"),
        (
            "SELECT * FROM comments c JOIN posts p ON p.id = c.post_id WHERE p.user_id = $1",
            "single-shard",
        ),
        ("SELECT * FROM comments c JOIN posts p ON p.id = c.post_id", "fan-out"),
        # likes.post_id -> posts.id is not the key: a like and its post may be on different shards
        (
            "SELECT * FROM likes l JOIN posts p ON p.id = l.post_id WHERE l.user_id = $1",
            "unroutable",
        ),
        (
            "SELECT * FROM likes l JOIN posts p ON p.user_id = l.user_id WHERE l.user_id = $1",
            "single-shard",
        ),
        (
            "SELECT * FROM users u JOIN countries c ON c.code = u.email WHERE u.id = $1",
            "unroutable",
        ),
        ("SELECT name FROM countries", "global"),
        ("INSERT INTO posts (user_id, title) VALUES ($1, $2)", "single-shard"),
        ("INSERT INTO posts (user_id, title) VALUES ($1, $2), ($3, $4)", "multi-shard"),
        ("INSERT INTO posts (title) VALUES ($1)", "unroutable"),
        ("INSERT INTO users (email) VALUES ($1)", "single-shard"),  # a new root row: its ID's shard
        ("UPDATE posts SET title = $1 WHERE id = $2", "single-shard"),
        ("DELETE FROM likes WHERE post_id = $1", "fan-out"),
        # Django's shape: quoted, table-qualified columns; LIMIT and ORDER BY change nothing
        (
            'SELECT "posts"."id", "posts"."title" FROM "posts" WHERE "posts"."user_id" = $1 LIMIT $2',
            "single-shard",
        ),
        (
            'SELECT "posts"."id" FROM "posts" WHERE "posts"."id" IN ($1 /*, ... */) ORDER BY 1',
            "multi-shard",
        ),
        # a subquery on the same key keeps the statement on one shard
        (
            (
                "SELECT * FROM posts p WHERE p.user_id = $1 AND EXISTS "
                "(SELECT 1 FROM likes l WHERE l.user_id = p.user_id)"
            ),
            "single-shard",
        ),
        ("SELECT * FROM messages WHERE sender_id = $1", "single-shard"),
        ("SELECT * FROM messages WHERE recipient_id = $1", "fan-out"),
        # Prisma qualifies every column with the schema and the table
        (
            'SELECT "public"."posts"."id" FROM "public"."posts" WHERE "public"."posts"."user_id" = $1',
            "single-shard",
        ),
        (
            'SELECT "public"."posts"."id" FROM "public"."posts" WHERE "other"."posts"."user_id" = $1',
            "fan-out",
        ),
    ],
)
def test_query_classes(sql, cls):
    assert classify(sql, PLANS, TABLES, "public")[0] == cls


@pytest.mark.parametrize(
    "sql", ["BEGIN", "SET x = 1", "SELECT 1", "SELECT * FROM pg_class", "not sql"]
)
def test_statements_outside_the_app_tables_are_left_out(sql):
    assert classify(sql, PLANS, TABLES, "public") is None


def test_table_kinds():
    assert {n: (p.kind, p.key) for n, p in PLANS.items()} == {
        "users": ("root", "id"),
        "posts": ("column", "user_id"),
        "comments": ("fk-path", None),
        "likes": ("column", "user_id"),
        "countries": ("global", None),
        "messages": ("column", "sender_id"),
    }
    assert PLANS["comments"].path == ["comments.post_id -> posts.id", "posts.user_id -> users.id"]


def test_blockers_of_hand_made_tables():
    blockers = table_blockers(TABLES, PLANS, "user_id")
    assert {(b.kind, b.table, b.message.split(" (")[0]) for b in blockers} == {
        (
            "no-key-column",
            "comments",
            (
                "comments has no key column: its key comes through comments.post_id -> posts.id then "
                "posts.user_id -> users.id; add user_id, backfill it from posts, and have the app"
            ),
        ),
        ("foreign-key", "likes", "FOREIGN KEY likes_post"),
        ("foreign-key", "messages", "FOREIGN KEY messages_recipient"),
    }
    assert blockers[0].fix == [
        "ALTER TABLE comments ADD COLUMN user_id bigint;",
        (
            "UPDATE comments AS c SET user_id = p.user_id FROM posts AS p WHERE p.id = c.post_id "
            "AND c.user_id IS NULL;"
        ),
        "ALTER TABLE comments ALTER COLUMN user_id SET NOT NULL;",
        "ALTER TABLE posts ADD UNIQUE (user_id, id);",
        (
            "ALTER TABLE comments DROP CONSTRAINT comments_post, ADD CONSTRAINT comments_post "
            "FOREIGN KEY (user_id, post_id) REFERENCES posts (user_id, id);"
        ),
    ]


def _run(finished: bool, **summary) -> dict:
    return {
        "started_at": "t0",
        "finished_at": "t1" if finished else None,
        "chunks": 3,
        "checked": 3 if finished else 1,
        "summary": summary,
    }


@pytest.mark.parametrize(
    ("run", "passes"),
    [
        (None, False),  # never ran
        (_run(False), False),  # killed or still running
        (_run(True, ok=True, problems=[]), True),
        (_run(True, ok=False, problems=["insta1.users: 1 row differs"]), False),
        # no row differs, but a dark read does: verify exits 1, so the cutover must refuse too
        (_run(True, ok=False, problems=[], dark_reads={"differs": 1, "same": 9}), False),
        (_run(True, problems=[]), True),  # a summary recorded before it had "ok"
    ],
)
def test_the_cutover_takes_a_finished_run_with_no_difference(run, passes):
    from shardctl.sql.catalog.adopt_verify import passed

    assert passed(run) is passes
