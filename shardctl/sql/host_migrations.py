"""Host-level migrations: a second, small history run once per host database, before the shard migrations.

Files ``H0001__extensions.sql`` sit in the migrations folder beside the shard migrations (``V…``).
They hold what belongs to the whole database, not to one shard: extensions, shared types, roles.
Each is a Jinja template (``StrictUndefined``) rendered per host with ``host`` (the host's name),
``ext_schema`` (``public``: the schema every shard's ``search_path`` sees, after the shard's own)
and ``layout``. It runs with ``search_path = public``, so ``CREATE EXTENSION pgcrypto`` lands in
``public``, which shard migrations (``search_path = <shard>, public``) and the Router's transactions
see. The ledger checksum is the file's source: the same file has the same checksum on every host.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import BadInput
from ..model.topology import Topology
from .migrations import (
    HOST_FILE_NAME,
    Migration,
    _compiled,
    in_sequence,
    migrations_dir,
    read_files,
)
from .render import layout_context, render_errors, template_line

EXT_SCHEMA = "public"  # where host-level migrations put extensions: on every shard's search_path


@dataclass(frozen=True)
class HostLevelMigration(Migration):
    """One ``H<version>__<description>.sql`` file."""

    def render(self, topo: Topology, host: str = "", context: dict | None = None) -> str:  # type: ignore[override]
        ctx = context if context is not None else host_context(topo, host)
        try:
            return _compiled(self.source, str(self.path)).render(ctx)
        except render_errors() as exc:
            line = template_line(exc, "<template>")
            where = f"{self.name}:{line}" if line else self.name
            raise BadInput(
                f"host-level migration {where} does not render: "
                f"{getattr(exc, 'message', None) or exc}"
            ) from None

    def sql(self, topo: Topology, host: str = "", context: dict | None = None) -> str:  # type: ignore[override]
        """The SQL to run on ``host``: rendered, parsed and checked (BadInput names the file and line)."""
        text = self.render(topo, host, context)
        self._check_statements(text, f"host-level migration {self.name} (rendered for host {host})")
        return text

    def host_checksum(self) -> str:
        return self.source_digest


def host_context(topo: Topology, host: str) -> dict:
    return {"host": host, "ext_schema": EXT_SCHEMA, "layout": layout_context(topo.layout)}


def load_host(directory: Path) -> list[HostLevelMigration]:
    """The host-level migrations of ``directory`` (H1, H2, … without gaps or duplicates). The folder's
    other files are checked by ``migrations.load``; an empty list when there are none."""
    found = read_files(directory, HOST_FILE_NAME, HostLevelMigration, "host-level migration")
    return in_sequence(found, "host-level migration", "H")


def host_for_topology(topo: Topology) -> list[HostLevelMigration]:
    return load_host(migrations_dir(topo))
