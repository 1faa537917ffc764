"""Django by pre-adoption IDs, in a subprocess (Django's settings are per process): ``python
django_adopt.py TASK_ID USER_ID`` with SHARDCTL_CONFIG set to an adopted fleet's topology (the
example app's settings). A model of the adopted app's ``tasks`` table is declared here, unmanaged;
``.get(pk=...)`` by an old ID prints one JSON line the fleet test checks
(tests/fleet/test_adopt_old_ids.py)."""

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


class Task(ShardedModel):
    shard_key = "user_id"
    id = models.BigIntegerField(primary_key=True)
    title = models.TextField()
    user_id = models.BigIntegerField()

    class Meta:
        app_label = "gram"
        db_table = "tasks"
        managed = False


class Plan(models.Model):  # a global table of the adopted database: not sharded
    id = models.IntegerField(primary_key=True)
    name = models.TextField()

    class Meta:
        app_label = "gram"
        db_table = "plans"
        managed = False


if __name__ == "__main__":
    task = Task.objects.get(pk=int(sys.argv[1]))
    task.title = task.title  # a save by the old ID goes to the same shard
    task.save(update_fields=["title"])
    plans = sorted(Plan.objects.values_list("name", flat=True))
    print(json.dumps({"id": task.id, "title": task.title, "user_id": task.user_id, "plans": plans}))
