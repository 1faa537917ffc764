"""The FastAPI example (examples/fastapi_app/main.py) with one more route, for tests only: a user's photo
IDs and the shard schema that answered them, read as the example reads (its session dependency), so
the history checker can tell a read answered by another shard (support.web.WebTraffic)."""

from main import DB, Photo, app
from sqlalchemy import func, select


@app.get("/_history/users/{user_id}/photos")
async def answered(user_id: int, db: DB) -> dict:
    query = select(func.current_schema(), func.array_agg(Photo.id)).where(Photo.user_id == user_id)
    schema, ids = (await db.execute(query)).one()
    return {"schema": schema, "ids": ids or []}
