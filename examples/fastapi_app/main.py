"""An Instagram-like web app on a sharded fleet: FastAPI over shardctl.sqlalchemy's asyncio sessions.

    SHARDCTL_CONFIG=fleet/shardctl.yaml uvicorn main:app

The glue is the lifespan, the session dependency and the ShardMoved handler; the rest is plain FastAPI
and SQLAlchemy.
"""

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from models import Like, Photo, User  # the SQLAlchemy example's models (each names its shard key)
from pydantic import BaseModel
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from shardctl import AsyncRouter, Topology
from shardctl.errors import ShardMoved
from shardctl.sqlalchemy.asyncio import async_sessionmaker


# glue: an AsyncRouter over the topology ($SHARDCTL_CONFIG, as for the CLI) for the app's lifetime, a
# session factory over it, and an AsyncSession per request
@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    topology = Topology.load(os.environ.get("SHARDCTL_CONFIG", "shardctl.yaml"))
    async with AsyncRouter(topology) as router:
        app.state.Session = async_sessionmaker(router, expire_on_commit=False)
        yield


async def session(request: Request) -> AsyncIterator[AsyncSession]:
    async with request.app.state.Session() as s:
        yield s


app = FastAPI(lifespan=lifespan)
DB = Annotated[AsyncSession, Depends(session)]


# A shard moved after the request's transaction had sent it a statement (a transaction's first statement
# follows a move by itself): 503, and the client's retry is routed to the shard's new host.
@app.exception_handler(ShardMoved)
async def shard_moved(request: Request, exc: ShardMoved) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, status_code=503, headers={"Retry-After": "0"})


class NewUser(BaseModel):
    username: str


class NewPhoto(BaseModel):
    caption: str


class NewLike(BaseModel):
    user_id: int


def photo_json(photo: Photo) -> dict:
    return {"id": photo.id, "user_id": photo.user_id, "caption": photo.caption}


@app.post("/users")
async def sign_up(body: NewUser, db: DB) -> dict:
    user = User(username=body.username)  # in the shard of md5(username), its id from there
    db.add(user)
    await db.commit()
    return {"id": user.id, "username": user.username}


@app.get("/users/{user_id}")
async def get_user(user_id: int, db: DB) -> dict:
    user = await db.get(User, user_id)  # the shard inside the ID
    if user is None:
        raise HTTPException(404, "no such user")
    return {"id": user.id, "username": user.username}


@app.post("/users/{user_id}/photos")
async def post_photo(user_id: int, body: NewPhoto, db: DB) -> dict:
    photo = Photo(user_id=user_id, caption=body.caption)  # on its owner's shard: inside user_id
    db.add(photo)
    await db.commit()
    return photo_json(photo)


@app.get("/users/{user_id}/photos")
async def photos_of(user_id: int, db: DB) -> list[dict]:
    photos = await db.scalars(
        select(Photo).where(Photo.user_id == user_id).order_by(Photo.id.desc())
    )
    return [photo_json(p) for p in photos]


@app.get("/photos/{photo_id}")
async def get_photo(photo_id: int, db: DB) -> dict:
    photo = await db.get(Photo, photo_id)  # the shard inside the ID
    if photo is None:
        raise HTTPException(404, "no such photo")
    return photo_json(photo)


@app.post("/photos/{photo_id}/likes")
async def like(photo_id: int, body: NewLike, db: DB) -> dict:
    row = Like(photo_id=photo_id, user_id=body.user_id)  # with its photo: the shard inside photo_id
    db.add(row)
    await db.commit()
    count = select(func.count()).select_from(Like).where(Like.photo_id == photo_id)
    return {"id": row.id, "likes": await db.scalar(count)}


@app.get("/stats")
async def stats(db: DB) -> dict:
    every_shard = select(func.count()).select_from(User).execution_options(all_shards=True)
    return {"users": sum(n for (n,) in await db.execute(every_shard))}
