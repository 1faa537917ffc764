"""Edits to the topology file that keep it readable: comments, key order and quoting survive.

Every edit is validated as a whole new topology before it is written, and the
file is replaced atomically (write a temporary file beside it, then rename).
"""

from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.scalarstring import DoubleQuotedScalarString

from ..errors import BadInput, ConfigError
from .ranges import format_shards, parse_shards
from .topology import Topology


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
            self.doc = self._yaml.load(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"topology file not found: {self.path}") from None

    # ---- edits -----------------------------------------------------------------
    def _host_node(self, name: str) -> CommentedMap:
        for node in self.doc.get("hosts") or []:
            if isinstance(node, dict) and node.get("name") == name:
                return node
        raise BadInput(f"unknown host {name!r}")

    def add_host(self, name: str, dsn: str, *, password_env: str | None = None, standby: str | None = None) -> None:
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

    # ---- output ----------------------------------------------------------------
    def text(self) -> str:
        out = io.StringIO()
        self._yaml.dump(self.doc, out)
        return out.getvalue()

    def validate(self) -> Topology:
        """The edited document as a validated Topology (raises ConfigErrors, nothing written)."""
        return Topology.from_text(self.text(), path=self.path, allow_inline_password=self.allow_inline_password)

    def save(self) -> Topology:
        """Validate, then replace the file atomically. Returns the new topology."""
        topo = self.validate()
        text = self.text()
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
        return topo
