"""Edits to the topology file that keep it readable: comments, key order and quoting survive.

Every edit is validated as a whole new topology before it is written, and the
file is replaced atomically (write a temporary file beside it, then rename).
"""

from __future__ import annotations

import io
import os
import tempfile
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.scalarstring import DoubleQuotedScalarString

from ..errors import BadInput, ConfigError, OperationFailed
from .adoption import AUTHORITIES, Adoption, default_id_map
from .file_lock import file_lock
from .ranges import format_shards, parse_shards
from .topology import Topology


def topology_file_lock(path: str | os.PathLike) -> AbstractContextManager[None]:
    """Serialise read-modify-write of the topology file between shardctl processes on this machine
    (an exclusive lock on ``.NAME.lock`` beside it). Re-entrant within a process."""
    path = Path(path).resolve()
    return file_lock(path.parent / f".{path.name}.lock")


def flip_topology(
    path: str | os.PathLike,
    shards: list[int],
    frm: str,
    to: str,
    allow_inline_password: bool = False,
) -> bool:
    """Give ``shards`` to host ``to`` in the topology file. False if the file already says so."""
    with topology_file_lock(path):
        edit = TopologyFile(path, allow_inline_password=allow_inline_password)
        src, dst, moving = set(edit.host_shards(frm)), set(edit.host_shards(to)), set(shards)
        if moving <= dst and not moving & src:
            return False
        stray = moving - src - dst
        if stray:
            raise OperationFailed(
                f"the topology file gives shards {format_shards(stray)} to neither {frm} nor "
                f"{to}; it was edited during the move: fix it by hand"
            )
        edit.set_host_shards(frm, sorted(src - moving))
        edit.set_host_shards(to, sorted(dst | moving))
        edit.save()
        return True


def write_adoption(
    path: str | os.PathLike,
    adoption: Adoption | None = None,
    allow_inline_password: bool = False,
    **section: Any,
) -> Topology:
    """Write (or replace) the topology file's ``adoption:`` section; returns the new topology.

    ``adoption``, or the section's keys as they are written (``source={"dsn": ...}``, ``schema``,
    ``authoritative``, ``id_floor``, ``tables={name: {"id": ..., "key": ...}}``, ``globals``,
    ``id_map``). Without ``id_map`` the id map's default place is written (the global host, else the
    first host; database ``shardctl_adopt_ids``), where ``ensure_id_map`` puts it."""
    with topology_file_lock(path):
        edit = TopologyFile(path, allow_inline_password=allow_inline_password)
        doc = adoption.document() if adoption is not None else dict(section)
        if doc.get("id_map") is None:
            placement = edit.doc.get("placement") or {}
            first = (edit.doc.get("hosts") or [{}])[0].get("name")
            place = default_id_map(placement.get("global_host"), first)
            doc["id_map"] = {"host": place.host, "dbname": place.dbname}
        edit.set_adoption(doc)
        return edit.save()


def flip_adoption(path: str | os.PathLike, to: str, allow_inline_password: bool = False) -> bool:
    """Make ``to`` (``source`` or ``fleet``) authoritative for the adopted tables: what the cutover
    (``fleet``) and its abort (``source``) write; Routers follow the file. False if it already says so."""
    if to not in AUTHORITIES:
        raise BadInput(f"adoption.authoritative must be source or fleet, got {to!r}")
    with topology_file_lock(path):
        edit = TopologyFile(path, allow_inline_password=allow_inline_password)
        section = edit.doc.get("adoption")
        if not isinstance(section, dict):
            raise BadInput(f"{path}: the topology has no adoption section")
        if section.get("authoritative", "source") == to:
            return False
        if to == "source" and "source" not in section:
            raise BadInput(f"{path}: adoption.source was dropped (--cleanup): no way back to it")
        section["authoritative"] = to
        edit.save()
        return True


def drop_adoption_source(path: str | os.PathLike, allow_inline_password: bool = False) -> bool:
    """Forget the old database (``adopt cutover --cleanup``): drop ``adoption.source`` and keep
    ``id_floor``, ``tables`` and ``id_map`` (old IDs live forever). False if it is already gone."""
    with topology_file_lock(path):
        edit = TopologyFile(path, allow_inline_password=allow_inline_password)
        section = edit.doc.get("adoption")
        if not isinstance(section, dict) or "source" not in section:
            return False
        if section.get("authoritative", "source") != "fleet":
            raise BadInput(f"{path}: adoption.authoritative is not fleet: cut over before cleanup")
        del section["source"]
        edit.save()
        return True


class TopologyFile:
    """The topology as an editable round-trip YAML document."""

    def __init__(self, path: str | os.PathLike, *, allow_inline_password: bool = False):
        self.path = Path(path)
        self.allow_inline_password = allow_inline_password
        self._yaml = YAML(typ="rt")
        self._yaml.preserve_quotes = True
        self._yaml.indent(mapping=2, sequence=4, offset=2)
        self._yaml.width = 4096
        try:
            self.loaded_text = self.path.read_text(encoding="utf-8")
            self.doc = self._yaml.load(self.loaded_text)
        except FileNotFoundError:
            raise ConfigError(f"topology file not found: {self.path}") from None

    # ---- edits -----------------------------------------------------------------
    def _host_node(self, name: str) -> CommentedMap:
        for node in self.doc.get("hosts") or []:
            if isinstance(node, dict) and node.get("name") == name:
                return node
        raise BadInput(f"unknown host {name!r}")

    def add_host(
        self, name: str, dsn: str, *, password_env: str | None = None, standby: str | None = None
    ) -> None:
        node = CommentedMap()
        node["name"] = name
        node["dsn"] = DoubleQuotedScalarString(dsn)
        if password_env:
            node["password_env"] = password_env
        if standby:
            node["standby"] = DoubleQuotedScalarString(standby)
        node["shards"] = []
        self.doc["hosts"].append(node)

    def host_shards(self, name: str) -> list[int]:
        value = self._host_node(name).get("shards")
        if value in (None, [], ""):
            return []
        return parse_shards(value)

    def set_host_shards(self, name: str, shards: list[int]) -> None:
        node = self._host_node(name)
        node["shards"] = DoubleQuotedScalarString(format_shards(shards)) if shards else []

    def set_count(self, count: int) -> None:
        self.doc["shards"]["count"] = count

    def pin_modulus(self, modulus: int) -> None:
        """Record the routing modulus explicitly, so growing the shard count never re-buckets keys."""
        routing = self.doc.get("routing")
        if routing is None:
            routing = CommentedMap()
            self.doc["routing"] = routing
        routing["modulus"] = modulus

    def set_new_objects(self, shards: list[int]) -> None:
        placement = self.doc.get("placement")
        if placement is None:
            placement = CommentedMap()
            self.doc["placement"] = placement
        placement["new_objects"] = DoubleQuotedScalarString(format_shards(shards))

    def set_adoption(self, adoption: Adoption | dict[str, Any]) -> None:
        """Replace the ``adoption:`` section by ``adoption``'s document (or that document itself):
        DSNs quoted, one table a line. Validated when saved."""
        doc = adoption.document() if isinstance(adoption, Adoption) else adoption
        node = CommentedMap()
        for key, value in doc.items():
            if key == "source":
                src = CommentedMap()
                for k, v in value.items():
                    src[k] = DoubleQuotedScalarString(v) if k.endswith("dsn") else v
                src.fa.set_flow_style()
                node[key] = src
            elif key == "tables":
                tables = CommentedMap()
                for name, cols in value.items():
                    row = CommentedMap({k: v for k, v in cols.items() if v is not None})
                    row.fa.set_flow_style()
                    tables[name] = row
                node[key] = tables
            elif key in ("globals", "id_map"):
                flow = CommentedSeq(value) if key == "globals" else CommentedMap(value)
                flow.fa.set_flow_style()
                node[key] = flow
            else:
                node[key] = value
        self.doc["adoption"] = node

    # ---- output ----------------------------------------------------------------
    def text(self) -> str:
        out = io.StringIO()
        self._yaml.dump(self.doc, out)
        return out.getvalue()

    def validate(self) -> Topology:
        """The edited document as a validated Topology (raises ConfigErrors, nothing written)."""
        return Topology.from_text(
            self.text(), path=self.path, allow_inline_password=self.allow_inline_password
        )

    def save(self) -> Topology:
        """Validate, then replace the file atomically, under the topology file lock. Refuses when the file
        changed since it was read (another run, e.g. a move's cutover, wrote it meanwhile). Returns the
        new topology."""
        topo = self.validate()
        text = self.text()
        with topology_file_lock(self.path):
            if self.path.read_text(encoding="utf-8") != self.loaded_text:
                raise OperationFailed(
                    f"{self.path}: the topology file changed while this command ran (another "
                    f"shardctl run wrote it); nothing was written: run the command again"
                )
            self._replace(text)
            self.loaded_text = text
        return topo

    def _replace(self, text: str) -> None:
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            try:
                os.chmod(tmp, self.path.stat().st_mode & 0o777)
            except OSError:
                pass
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
