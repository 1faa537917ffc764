"""A tiny sharded app: users and their photos, written and read through shardctl's Router.

A new user goes to the shard the Router allocates for the username; the user's id (minted by
that shard's ``next_id()``) names the shard, so the user's photos are written and read there.
"""

from __future__ import annotations

from shardctl import Router


def create_user(router: Router, username: str) -> int:
    """Create a user on the shard allocated for ``username``; returns the new user id."""
    return router.run(
        shard=router.allocate_shard(username),
        work=lambda conn: conn.execute(
            "INSERT INTO users (username) VALUES (%s) RETURNING id", (username,)
        ).fetchone()[0],
    )


def add_photo(router: Router, user_id: int, caption: str) -> int:
    """Add a photo on its owner's shard (the one the user id names); returns the photo id."""
    return router.run(
        id=user_id,
        work=lambda conn: conn.execute(
            "INSERT INTO photos (user_id, caption) VALUES (%s, %s) RETURNING id", (user_id, caption)
        ).fetchone()[0],
    )


def photos_of(router: Router, user_id: int) -> list[tuple[int, str]]:
    """A user's photos, newest first: one query on one shard."""
    return router.read(
        id=user_id,
        query="SELECT id, caption FROM photos WHERE user_id = %s ORDER BY id DESC",
        params=(user_id,),
    )


def users_per_shard(router: Router) -> dict[int, int]:
    """How many users each shard holds (shards without users left out): a query on every shard."""
    counts = {}
    for shard in range(router.topology.shard_count):
        n = router.read(shard=shard, query="SELECT count(*) FROM users")[0][0]
        if n:
            counts[shard] = n
    return counts
