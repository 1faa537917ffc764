"""Decoding many IDs at once: per-line errors, owning schema and host, fast CSV output."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TextIO

from .errors import BadInput
from .layouts import Layout, iso, utc_from_ms
from .topology import Topology

_MAX_U64 = (1 << 64) - 1


class Decoder:
    """Decodes IDs of one layout; with a topology, adds schema and host and rejects unknown shards."""

    def __init__(self, layout: Layout, topology: Topology | None = None):
        self.layout = layout
        self.topology = topology
        self._fields = [(f.name, layout.shift(f.name), (1 << f.bits) - 1) for f in layout.fields]
        self._hosts = {n: h.name for h in topology.hosts for n in h.shards} if topology else {}

    def columns(self) -> list[str]:
        cols = ["id"]
        if self.layout.has_time:
            cols.append("time")
        cols += [f.name for f in self.layout.fields if f.name != "time"]
        if self.topology:
            cols += ["schema", "host"]
        return cols

    def decode(self, value: int) -> dict:
        """Decode one ID; BadInput when it is not an ID of this fleet."""
        out = self.layout.decode(value)
        if self.topology is not None:
            shard = out["shard"]
            host = self._hosts.get(shard)
            if host is None:
                raise BadInput(f"shard {shard} is not in this topology (0..{self.topology.shard_count - 1})")
            out["schema"] = self.topology.schema_name(shard)
            out["host"] = host
        return out

    def parse(self, text: str) -> int:
        stripped = text.strip()
        if not stripped:
            raise BadInput("empty line")
        try:
            return int(stripped, 10)
        except ValueError:
            raise BadInput("not an integer ID") from None

    def decode_lines(self, lines: Iterable[str]) -> tuple[list[dict], list[tuple[int, str, str]]]:
        """Decode every line; returns (decoded, [(line number, text, problem)])."""
        results: list[dict] = []
        bad: list[tuple[int, str, str]] = []
        for number, raw in enumerate(lines, start=1):
            text = raw.rstrip("\r\n")
            try:
                results.append(self.decode(self.parse(text)))
            except BadInput as exc:
                bad.append((number, text, str(exc)))
        return results, bad

    def write_csv(self, lines: Iterable[str], out: TextIO) -> list[tuple[int, str, str]]:
        """Decode to CSV with a header; the hot loop avoids per-ID dicts. Returns the bad lines."""
        layout = self.layout
        fields = [(s, m) for name, s, m in self._fields if name != "time"]
        has_time = layout.has_time
        time_shift, time_mask = (layout.shift("time"), (1 << layout.bits("time")) - 1) if has_time else (0, 0)
        epoch_s, epoch_ms_rem = divmod(layout.epoch_ms, 1000)
        shard_pos = [f.name for f in layout.fields if f.name != "time"].index("shard") \
            if "shard" in [f.name for f in layout.fields] else None
        payload_bits = layout.payload_bits
        signed = layout.negative_ids_possible()
        hosts = self._hosts if self.topology else None
        schema = self.topology.schema_name if self.topology else None
        second_cache: dict[int, str] = {}
        buf: list[str] = [",".join(self.columns()) + "\n"]
        bad: list[tuple[int, str, str]] = []
        write = out.write
        for number, raw in enumerate(lines, start=1):
            try:
                value = int(raw)
            except ValueError:
                text = raw.rstrip("\r\n")
                bad.append((number, text, "empty line" if not text.strip() else "not an integer ID"))
                continue
            if value < 0:
                if signed and value >= -(1 << 63):
                    value += 1 << 64
                else:
                    bad.append((number, raw.strip(), layout.negative_message(value)))
                    continue
            if value > _MAX_U64:
                bad.append((number, raw.strip(), f"{value} does not fit in 64 bits"))
                continue
            if value >> payload_bits:
                bad.append((number, raw.strip(), f"{value} has its reserved high bit(s) set"))
                continue
            parts = [(value >> s) & m for s, m in fields]
            row = [str(value if value < (1 << 63) else value - (1 << 64))]
            if has_time:
                total = ((value >> time_shift) & time_mask) + epoch_ms_rem
                secs, ms = divmod(total, 1000)
                secs += epoch_s
                stamp = second_cache.get(secs)
                if stamp is None:
                    if len(second_cache) > 100_000:
                        second_cache.clear()
                    stamp = second_cache[secs] = _second_text(secs)
                # Beyond year 9999 there is no timestamp to print (decode() gives time None).
                row.append(f"{stamp}.{ms:03d}Z" if stamp else "")
            row += [str(p) for p in parts]
            if hosts is not None:
                shard = parts[shard_pos]
                host = hosts.get(shard)
                if host is None:
                    bad.append((number, raw.strip(), f"shard {shard} is not in this topology"))
                    continue
                row += [schema(shard), host]
            buf.append(",".join(row) + "\n")
            if len(buf) >= 8192:
                write("".join(buf))
                buf.clear()
        write("".join(buf))
        return bad


def _second_text(secs: int) -> str:
    """``YYYY-MM-DDTHH:MM:SS`` of a Unix second, formatted as :func:`layouts.iso` does; "" out of range."""
    text = iso(utc_from_ms(secs * 1000))
    return text[:19] if text else ""
