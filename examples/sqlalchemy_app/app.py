"""An Instagram-like app on a sharded fleet through shardctl.sqlalchemy.

    SHARDCTL_CONFIG=fleet/shardctl.yaml python app.py

The glue is the three lines under "glue"; the rest is plain SQLAlchemy.
"""

from __future__ import annotations

import os

from models import Like, Photo, User
from sqlalchemy import func, select

from shardctl import Router, Topology
from shardctl.sqlalchemy import sessionmaker


def make_sessions(topology_path: str | None = None):
    # glue: a Router over the topology ($SHARDCTL_CONFIG, as for the CLI), and a session factory over it
    router = Router(
        Topology.load(topology_path or os.environ.get("SHARDCTL_CONFIG", "shardctl.yaml"))
    )
    return sessionmaker(router, expire_on_commit=False)


def sign_up(Session, username: str) -> User:
    with Session() as session:
        user = User(username=username)
        session.add(user)
        session.commit()
        return user


def post_photo(Session, user_id: int, caption: str) -> Photo:
    """A photo on its owner's shard (Photo.__shard_key_is_id__: the shard inside user_id)."""
    with Session() as session:
        photo = Photo(user_id=user_id, caption=caption)
        session.add(photo)
        session.commit()
        return photo


def like(Session, photo_id: int, user_id: int) -> Like:
    with Session() as session:
        row = Like(photo_id=photo_id, user_id=user_id)
        session.add(row)
        session.commit()
        return row


def photo_by_id(Session, photo_id: int) -> Photo | None:
    """A photo from its ID alone: the shard is inside the ID."""
    with Session() as session:
        return session.get(Photo, photo_id)


def photos_of(Session, user_id: int) -> list[Photo]:
    with Session() as session:
        return list(
            session.scalars(select(Photo).where(Photo.user_id == user_id).order_by(Photo.id.desc()))
        )


def like_count(Session, photo_id: int) -> int:
    with Session() as session:
        return session.scalar(
            select(func.count()).select_from(Like).where(Like.photo_id == photo_id)
        )


def user_count(Session) -> int:
    """Every shard, asked for explicitly."""
    with Session() as session:
        counts = session.execute(
            select(func.count()).select_from(User).execution_options(all_shards=True)
        )
        return sum(n for (n,) in counts)


def main(path: str | None = None) -> None:
    Session = make_sessions(path)
    alice = sign_up(Session, "alice")
    photo = post_photo(Session, alice.id, "sunset")
    like(Session, photo.id, alice.id)
    found = photo_by_id(Session, photo.id)
    print(
        f"photo {found.id} by user {found.user_id}: {found.caption!r}, {like_count(Session, photo.id)} like(s)"
    )
    print(
        f"{len(photos_of(Session, alice.id))} photo(s) of alice, {user_count(Session)} user(s) in all"
    )
    shard = Session.shards.router.shard_of_id
    print(f"alice and her photo live on shard {shard(alice.id)} and {shard(photo.id)}")


if __name__ == "__main__":
    main()
