"""The example's models: plain SQLAlchemy declarative classes over the tables of migrations/.

Two class attributes are all shardctl needs: ``__shard_key__`` (where a new row goes) and, when that
key's values are IDs, ``__shard_key_is_id__`` (the row goes to the shard inside the ID: a user's photos
and a photo's likes live on the same shard as their owner). Every primary key is an ID from its shard's
next_id().
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, DateTime, FetchedValue, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class User(Base):
    __tablename__ = "users"
    __shard_key__ = "username"  # a new user goes to the shard of md5(username)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, server_default=FetchedValue())
    username: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=FetchedValue()
    )


class Photo(Base):
    __tablename__ = "photos"
    # A photo lives with its owner: user_id is the owner's ID, so the shard inside it is the user's shard.
    __shard_key__ = "user_id"
    __shard_key_is_id__ = True

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, server_default=FetchedValue())
    user_id: Mapped[int] = mapped_column(BigInteger)
    caption: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=FetchedValue()
    )


class Like(Base):
    __tablename__ = "likes"
    __shard_key__ = "photo_id"  # a photo's likes live with the photo: the shard inside photo_id
    __shard_key_is_id__ = True

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, server_default=FetchedValue())
    photo_id: Mapped[int] = mapped_column(BigInteger)
    user_id: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=FetchedValue()
    )
