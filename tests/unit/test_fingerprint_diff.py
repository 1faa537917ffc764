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
        "column caption on photos differs: '#2 text not null' (reference: '#2 text')",
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


def test_each_difference_names_the_migration_that_makes_the_object():
    """Reference.made_by: the version whose step made, changed or dropped an object (the majority of
    shards is never asked)."""
    from shardctl.ops.reference import Reference

    index = ("index", "photos", "photos_user_id_idx")
    caption = ("column", "photos", "caption")
    v1 = {k: v for k, v in REFERENCE.items() if k not in (index, caption)}
    v2 = dict(REFERENCE)
    v3 = {k: v for k, v in v2.items() if k[2] != "likes" and k[1] != "likes"}
    v3[caption] = "#2 text not null"
    ref = Reference(
        "pg1",
        0,
        objects={0: {}, 1: v1, 2: v2, 3: v3},
        names={1: "V0001__a.sql", 2: "V0002__b.sql", 3: "V0003__c.sql"},
    )
    shard = dict(v1)
    shard[("table", "", "likes")] = "r p owner app"
    assert differences(v3, shard, why=lambda k, case: ref.made_by(k, 3, case)) == [
        "extra table likes (V0003__c.sql dropped it)",
        "missing column caption on photos (V0003__c.sql should have made it)",
        "missing index photos_user_id_idx on photos (V0002__b.sql should have made it)",
    ]
    shard[caption] = "#2 text"
    assert differences(v3, shard, why=lambda k, case: ref.made_by(k, 3, case))[1] == (
        "column caption on photos differs: '#2 text' (reference: '#2 text not null') (V0003__c.sql "
        "defines it so)"
    )
    assert ref.made_by(("type", "", "mood"), 3, "extra") == "no migration makes it"
