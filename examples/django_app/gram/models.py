"""Users, photos and likes, each in its shard's schema. A user lives on the shard of its username; a
photo on its owner's shard (``shard_key_is_id``: ``user_id`` is the owner's ID, which names that
shard); a like on its photo's (the photo's ID names it). So a user's photos and their likes share the
user's shard. Every ID comes from the shard's next_id(), so a get by ID needs nothing else."""

from django.db import models

from shardctl.django.models import ShardedModel, ShardIdField


class User(ShardedModel):
    shard_key = "username"
    id = ShardIdField(primary_key=True)
    username = models.TextField()

    class Meta:
        db_table = "gram_users"


class Photo(ShardedModel):
    shard_key = "user_id"
    shard_key_is_id = True  # a user's ID: the photo lives on its owner's shard
    id = ShardIdField(primary_key=True)
    user_id = models.BigIntegerField()
    caption = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "gram_photos"
        indexes = [models.Index(fields=["user_id", "-id"], name="gram_photos_user")]


class Like(ShardedModel):
    shard_key = "photo_id"
    shard_key_is_id = True  # a photo's ID: the like lives with its photo (so on the owner's shard)
    id = ShardIdField(primary_key=True)
    photo_id = models.BigIntegerField()
    user_id = models.BigIntegerField()

    class Meta:
        db_table = "gram_likes"
        constraints = [
            models.UniqueConstraint(fields=["photo_id", "user_id"], name="gram_likes_once")
        ]
