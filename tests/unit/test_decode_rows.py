"""``Decoder.rows``, the fast loop behind every ``decode-id`` output (CSV, --json, the table), against
``Decoder.decode``, the per-ID reference: the same text for every ID, the same bad lines."""

from __future__ import annotations

import json
import random

import pytest

from shardctl.errors import BadInput
from shardctl.ids.decode import BadLines, Decoder
from shardctl.model.layouts import custom, instagram, pinterest, snowflake
from shardctl.model.topology import Topology

TOPOLOGY = """\
version: 1
id:
  layout: instagram
  epoch: "2011-01-01T00:00:00Z"
shards:
  count: 100
hosts:
  - name: pg1
    dsn: "postgresql://app@127.0.0.1:1/app1"
    shards: "0-49"
  - name: pg2
    dsn: "postgresql://app@127.0.0.1:1/app2"
    shards: "50-99"
"""


def decoders() -> dict[str, Decoder]:
    topo = Topology.from_text(TOPOLOGY)
    return {
        "instagram with topology": Decoder(topo.layout, topo),
        "instagram": Decoder(instagram(1293840000000)),
        "pinterest": Decoder(pinterest()),
        "snowflake": Decoder(snowflake()),
        "custom beyond year 9999": Decoder(custom(0, 60, 2, 1)),
    }


def lines(decoder: Decoder, seed: int) -> list[str]:
    """Valid and invalid IDs of every kind: IDs of the layout (with shards 0-119, so some outside the
    topology), random 64-bit values (with bits above a layout's payload), the top of the signed
    range, negatives, padding, and junk."""
    rng = random.Random(seed)
    layout = decoder.layout
    values = [rng.getrandbits(rng.choice([20, 41, 55, 62, 63, 64])) for _ in range(2000)]
    for _ in range(2000):
        parts = {f.name: rng.getrandbits(f.bits) for f in layout.fields}
        if "shard" in parts:
            parts["shard"] = rng.randrange(min(120, 1 << layout.bits("shard")))
        values.append(layout.encode(**parts))
    values += [0, 1, (1 << 63) - 1, 1 << 63, (1 << 64) - 1, 1 << 64, -1, -(1 << 63), -(1 << 63) - 1]
    out = [f"{v}\n" for v in values]
    out += [" 42 \n", "+7\n", "\n", "abc\n", "1.5\n", "0x10\n", "\u0661\n", "9" * 30 + "\n"]
    rng.shuffle(out)
    return out


def reference(decoder: Decoder, text: list[str]) -> tuple[list[dict], list[tuple]]:
    """Each good line's ``Decoder.decode`` parts, and the bad lines, one ID at a time."""
    good, bad = [], []
    for number, raw in enumerate(text, start=1):
        try:
            good.append(decoder.decode(decoder.parse(raw)))
        except BadInput as exc:
            bad.append((number, str(exc)))
    return good, bad


@pytest.mark.parametrize("name", list(decoders()))
@pytest.mark.parametrize("form", ["csv", "json", "cells"])
def test_every_form_writes_what_decode_says(name, form):
    decoder = decoders()[name]
    text = lines(decoder, seed=len(name))
    good, bad_expected = reference(decoder, text)
    assert len(good) > 1000 and len(bad_expected) >= 8  # both kinds are exercised
    bad = BadLines(keep=10_000)
    rows = [row for chunk in decoder.rows(text, form, bad) for row in chunk]
    cells = [tuple("" if p.get(c) is None else str(p[c]) for c in decoder.columns()) for p in good]
    if form == "json":
        assert rows == [json.dumps(parts) for parts in good]
    elif form == "cells":
        assert rows == cells
    else:
        assert rows == [",".join(c) + "\n" for c in cells]
    # The same lines are refused; the fast loop says why in its own words for some (a bad line's
    # text, not the parser's message), but always names the shard outside the topology the same way.
    assert [n for n, _, _ in bad] == [n for n, _ in bad_expected]
    for (_, _, problem), (_, expected) in zip(bad, bad_expected):
        if "is not in this topology" in expected:
            assert problem == expected


def test_an_unknown_form_is_refused():
    with pytest.raises(ValueError, match="form must be one of csv, json, cells, got 'xml'"):
        Decoder(pinterest()).rows(["1\n"], "xml", BadLines())
