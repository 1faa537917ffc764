"""sql/fingerprint.differences: object-level differences between two shards' catalog rows (no server)."""

from shardctl.sql.fingerprint import differences

REFERENCE = {
    ("schema", "", ""): "owner app acl",
    ("table", "", "photos"): "r p owner app",
    ("column", "photos", "id"): "#1 bigint not null default {schema}.next_id()",
    ("column", "photos", "caption"): "#2 text",
    (
        "index",
        "photos",
        "photos_user_id_idx",
    ): "CREATE INDEX photos_user_id_idx ON {schema}.photos (user_id)",
    ("table", "", "likes"): "r p owner app",
    ("column", "likes", "id"): "#1 bigint",
    ("constraint", "likes", "likes_pkey"): "p PRIMARY KEY (id)",
}


def test_identical_rows_have_no_differences():
    assert differences(REFERENCE, dict(REFERENCE)) == []


def test_missing_extra_and_changed_objects_are_named():
    shard = dict(REFERENCE)
    del shard[("index", "photos", "photos_user_id_idx")]
    shard[("column", "photos", "note")] = "#3 text"
    shard[("column", "photos", "caption")] = "#2 text not null"
    assert differences(REFERENCE, shard) == [
        "column caption on photos differs: '#2 text not null' (others: '#2 text')",
        "extra column note on photos",
        "missing index photos_user_id_idx on photos",
    ]


def test_a_missing_table_is_said_once_not_per_column():
    shard = {k: v for k, v in REFERENCE.items() if "likes" not in (k[1], k[2])}
    assert differences(REFERENCE, shard) == ["missing table likes"]
    assert differences(shard, REFERENCE) == ["extra table likes"]


def test_long_definitions_are_shortened_unless_limit_is_zero():
    shard = dict(REFERENCE)
    shard[("schema", "", "")] = "owner app acl " + "x" * 300
    (short,) = differences(REFERENCE, shard)
    assert (
        short.startswith("the schema itself differs: 'owner app acl xxx")
        and "…" in short
        and len(short) < 260
    )
    (whole,) = differences(REFERENCE, shard, limit=0)
    assert "x" * 300 in whole


def test_schema_groups_put_the_majority_first_and_break_ties_by_the_lowest_shard():
    from shardctl.ops.verify import schema_groups

    groups = schema_groups({0: "b", 1: "a", 2: "a", 3: "c", 4: "b"})
    assert [(g.fingerprint, g.shards, g.majority) for g in groups] == [
        ("b", [0, 4], True),
        ("a", [1, 2], False),
        ("c", [3], False),
    ]
    assert schema_groups({}) == []
