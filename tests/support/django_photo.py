"""``python django_photo.py USER_ID``, with SHARDCTL_CONFIG set to an adopting fleet's topology (the
Django example app's settings): ``Photo.objects.create(user_id=USER_ID)`` on a model of the adopted
``photos`` table whose key holds a user's ID (``shard_key_is_id``), and prints its ID as one JSON
line (tests/fleet/test_adopt_cutover.py).

``python django_photo.py --reads USER_ID``: for each line read from stdin, the (id, caption) of every
photo of USER_ID (``filter(user_id=...)``), printed as one JSON line, until stdin closes (a process
whose Router keeps its placement between the reads).

``python django_photo.py --posts AUTHOR_ID``: the same on the Django forum's ``forum_post``
(tests/data/apps/forum_django.sql) by ``author_id``, (id, body); a line ``edit ID BODY`` first sets
that post's body (``filter(author_id=..., id=...).update(body=...)``)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "examples" / "django_app"), str(ROOT)]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gramsite.settings")

import django

django.setup()

from django.db import models

from shardctl.django.models import ShardedModel


class AdoptedPhoto(ShardedModel):
    shard_key, shard_key_is_id = "user_id", True
    user_id = models.BigIntegerField()
    caption = models.TextField()

    class Meta:
        app_label = "gram"
        db_table = "photos"
        managed = False


class AdoptedPost(ShardedModel):
    shard_key, shard_key_is_id = "author_id", True
    author_id = models.IntegerField()
    body = models.TextField()

    class Meta:
        app_label = "gram"
        db_table = "forum_post"
        managed = False


if __name__ == "__main__":
    if sys.argv[1] == "--posts":
        author = int(sys.argv[2])
        for line in sys.stdin:
            if line.startswith("edit "):
                _, post, body = line.rstrip("\n").split(" ", 2)
                AdoptedPost.objects.filter(author_id=author, id=int(post)).update(body=body)
            rows = AdoptedPost.objects.filter(author_id=author).values_list("id", "body")
            print(json.dumps({"rows": sorted(rows)}), flush=True)
    elif sys.argv[1] == "--reads":
        user = int(sys.argv[2])
        for _ in sys.stdin:
            rows = AdoptedPhoto.objects.filter(user_id=user).values_list("id", "caption")
            print(json.dumps({"rows": sorted(rows)}), flush=True)
    else:
        photo = AdoptedPhoto.objects.create(user_id=int(sys.argv[1]), caption="by django")
        print(json.dumps({"id": photo.id}))
