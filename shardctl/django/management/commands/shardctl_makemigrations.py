"""``manage.py shardctl_makemigrations APP [APP ...]``: each Django migration of the apps' sharded
models becomes a shardctl migration file ``V000N__<app>_<migration>.sql`` (its ``sqlmigrate`` SQL:
unqualified names, which ``shardctl migrate`` runs with the shard's ``search_path``; no BEGIN/COMMIT,
as shardctl runs each file in its own transaction). Files already written are kept; the next ones are
numbered after the directory's highest version. Then ``shardctl migrate`` applies them to every shard."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.migrations.loader import MigrationLoader

from ...context import collecting_sql, configure, router

VERSION = re.compile(r"^V(\d+)__(.+)\.sql$")


class Command(BaseCommand):
    help = "Turn apps' Django migrations (their sharded models) into shardctl migration files."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("apps", nargs="+", help="app labels")
        parser.add_argument(
            "--config", help="the topology file (default: the one DATABASES was built from)"
        )
        parser.add_argument(
            "--dir", help="the migrations directory (default: the topology's migrations:)"
        )
        parser.add_argument(
            "--database", default=DEFAULT_DB_ALIAS, help="alias sqlmigrate renders with"
        )
        parser.add_argument("--dry-run", action="store_true", help="print the files, write nothing")

    def handle(self, *args: Any, **options: Any) -> None:
        topo = configure(options["config"]).topology if options["config"] else router().topology
        directory = Path(options["dir"] or topo.migrations_dir or "migrations")
        if not directory.is_dir():
            raise CommandError(f"{directory}: no such migrations directory")
        existing = {
            m.group(2): int(m.group(1)) for p in directory.iterdir() if (m := VERSION.match(p.name))
        }
        version = max(existing.values(), default=0)
        loader = MigrationLoader(connections[options["database"]], replace_migrations=False)
        for app in options["apps"]:
            if app not in loader.migrated_apps:
                raise CommandError(f"{app}: no Django migrations (run makemigrations {app} first)")
            names = [
                name
                for label, name in loader.graph.forwards_plan(max(loader.graph.leaf_nodes(app)))
                if label == app
            ]
            for name in names:
                if f"{app}_{name}" in existing:
                    continue
                body = shard_sql(app, name, options["database"])
                if not body:
                    continue
                version += 1
                path = directory / f"V{version:04d}__{app}_{name}.sql"
                text = (
                    f"-- Django migration {app}.{name} (manage.py shardctl_makemigrations)\n"
                    "{% raw %}\n" + body + "\n{% endraw %}\n"
                )
                if options["dry_run"]:
                    self.stdout.write(f"== {path}\n{text}")
                else:
                    path.write_text(text)
                    self.stdout.write(f"wrote {path}")


def shard_sql(app: str, name: str, database: str) -> str:
    """``sqlmigrate`` of one migration, the sharded models only, without BEGIN/COMMIT."""
    out = io.StringIO()
    with collecting_sql():
        call_command("sqlmigrate", app, name, database=database, stdout=out, no_color=True)
    lines = [
        line
        for line in out.getvalue().splitlines()
        if line.strip().upper() not in ("BEGIN;", "COMMIT;")
    ]
    statements = [line for line in lines if line.strip() and not line.strip().startswith("--")]
    return "\n".join(lines).strip() if statements else ""
