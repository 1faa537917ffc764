"""Commands that never connect: render, decode-id, encode-id, locate, info.

None of them imports psycopg (tests/unit/test_offline_imports.py); render imports the template
engine only when it runs.
"""

from __future__ import annotations

import itertools
import json
import sys

import click

from ..errors import BadInput
from ..ids import decode as decoding
from ..ids.old_ids import shard_of_key
from ..ids.routing import is_integer_key
from ..model.layouts import by_name, parse_epoch, utc_from_ms
from ..model.ranges import parse_shards
from . import cli, json_option, settings
from .output import emit, stdout, table
from .params import ASCII_INT, flag_option


@cli.command()
@click.option("--shard", "shard_spec", metavar="RANGE", help="Only these shards (e.g. 5 or 0-15).")
@click.option("--host", "host_name", help="Only the shards of this host (plus its control schema).")
@click.option(
    "--control/--no-control", default=True, show_default=True, help="Include the control schema."
)
@click.option(
    "--migrations/--no-migrations",
    "with_migrations",
    default=True,
    show_default=True,
    help="Include the rendered migrations.",
)
@json_option
def render(
    shard_spec: str | None,
    host_name: str | None,
    control: bool,
    with_migrations: bool,
    as_json: bool,
) -> None:
    """Print the SQL init would run, per host and shard, without connecting."""
    from ..sql import render as rendering
    from ..sql.migrations import for_topology

    topo = settings().topology()
    hosts = [topo.host(host_name)] if host_name else topo.hosts
    wanted = set(_shards(shard_spec, topo.shard_count)) if shard_spec else None
    migrations = for_topology(topo) if with_migrations else []
    doc: dict[str, dict] = {}
    for host in hosts:
        shards = [n for n in host.shards if wanted is None or n in wanted]
        if wanted is not None and not shards:
            continue
        doc[host.name] = rendering.render_host(topo, shards, control=control, migrations=migrations)

    def human() -> None:
        sys.stdout.write(rendering.render_text(topo, doc))

    emit(as_json, {"hosts": doc}, human)


def _shards(spec: str, count: int) -> list[int]:
    try:
        return parse_shards(spec, limit=count)
    except ValueError as exc:
        raise BadInput(f"--shard: {exc}") from None


def _foreign_layout(layout: str, epoch: str | None):
    epoch_ms = None
    if epoch is not None:
        try:
            epoch_ms = parse_epoch(epoch)
        except ValueError as exc:
            raise BadInput(f"--epoch: {exc}") from None
        if utc_from_ms(epoch_ms) is None:
            raise BadInput(f"--epoch: {epoch} is outside the years 1-9999")
    return by_name(layout, epoch_ms)


# ignore_unknown_options: a negative ID such as -42 (the signed form of a 64-bit ID) is an
# argument, not an unknown option; anything else that is not an option fails as a bad ID.
@cli.command("decode-id", context_settings={"ignore_unknown_options": True})
@click.argument("ids", nargs=-1)
@click.option(
    "--layout",
    type=click.Choice(["instagram", "pinterest", "snowflake"]),
    help="Decode foreign IDs with this layout instead of the topology's.",
)
@click.option("--epoch", help="Epoch for --layout (ISO-8601 or Unix ms).")
@click.option(
    "--table",
    help="The table of pre-adoption IDs (below an adoption's ID floor): shows which shard holds "
    "each (a non-root table's key is looked up where the Router looks it up: on the old database "
    "while it is authoritative, else in the id map).",
)
@flag_option("--csv", "as_csv", help="Write CSV (fast, for many IDs).")
@json_option
def decode_id(
    ids: tuple[str, ...],
    layout: str | None,
    epoch: str | None,
    table: str | None,
    as_csv: bool,
    as_json: bool,
) -> None:
    """Decode IDs (arguments, or stdin one per line) into time, shard, sequence, schema and host."""
    if epoch and not layout:
        raise BadInput("--epoch goes with --layout (the topology's IDs use the topology's epoch)")
    topo = None if layout else settings().topology()
    if table is not None and (topo is None or topo.adoption is None):
        raise BadInput("--table is for pre-adoption IDs: the topology has no adoption section")
    decoder = decoding.Decoder(
        topo.layout if topo else _foreign_layout(layout, epoch),
        topo,
        table=table,
        lookup=_id_map_lookup(topo) if table else None,
    )
    if not ids and sys.stdin.isatty():
        raise BadInput("give IDs as arguments or on stdin, one per line")
    # Streams in every mode: bounded line reads, rows written as decoded, bad lines counted.
    source = (
        decoding.bounded_arguments(ids)
        if ids
        else decoding.bounded_lines(decoding.utf8_reader(sys.stdin))
    )
    bad = decoding.BadLines()
    if as_csv:
        decoder.write_csv(source, sys.stdout, bad)
    elif as_json:
        _write_json(decoder.rows(source, "json", bad), bad)
    else:
        _write_table(decoder.columns(), decoder.rows(source, "cells", bad))
    if bad.count <= SHOW_BAD_LINES:
        for n, text, problem in bad:
            click.echo(f"error: line {n}: {text!r}: {problem}", err=True)
    elif bad:
        n, text, problem = bad.kept[0]
        listed = "" if as_json else f"; --json lists the first {bad.keep}"
        click.echo(
            f"error: {bad.count} lines are not IDs of this fleet, the first is line {n}: {text!r}: "
            f"{problem}{listed}",
            err=True,
        )
    if bad:
        sys.exit(2)


def _id_map_lookup(topo):
    """The key of a pre-adoption ID, read where the Router reads it (``lookup_key``: the old database
    while it is authoritative, else the id map; connects only when an ID needs it)."""

    def lookup(found, value: int):
        from ..ops.adopt.id_map import lookup_key

        return lookup_key(topo, found, value)

    return lookup


SHOW_BAD_LINES = 5  # more bad lines than this are summed up in one line on stderr
TABLE_ROWS = 1000  # more decoded IDs than this print as plain aligned lines, not a rich table


# Bytes of decoded IDs held in memory while ``decode-id --json`` streams; beyond, a temporary file.
SPOOL_BYTES = 1 << 20


def _write_json(chunks, bad) -> None:
    """One JSON document, ``command`` and ``ok`` first like every ``--json`` document: the IDs are
    decoded into a spool (memory, then a temporary file: never held whole) until ``ok`` is known,
    then written. ``chunks`` are lists of each ID's JSON object (``Decoder.rows(..., "json", ...)``)."""
    import shutil  # only here: the other offline commands start without them
    import tempfile

    with tempfile.SpooledTemporaryFile(SPOOL_BYTES, mode="w+", encoding="utf-8") as ids:
        sep = "\n    "
        for chunk in chunks:
            if chunk:
                ids.write(sep + ",\n    ".join(chunk))
                sep = ",\n    "
        ids.write("]" if sep == "\n    " else "\n  ]")
        write = sys.stdout.write
        write(f'{{\n  "command": "decode-id",\n  "ok": {"false" if bad else "true"},\n  "ids": [')
        ids.seek(0)
        shutil.copyfileobj(ids, sys.stdout)
    errors = [{"line": n, "input": t, "error": e} for n, t, e in bad]
    write(',\n  "errors": ' + json.dumps(errors))
    if bad.count > len(errors):
        write(f',\n  "errors_total": {bad.count}')
    write("\n}\n")


def _write_table(columns: list[str], chunks) -> None:
    """A rich table for up to TABLE_ROWS IDs; beyond that, plain aligned lines as they come. ``chunks``
    are lists of each ID's cells (``Decoder.rows(..., "cells", ...)``)."""
    rows = itertools.chain.from_iterable(chunks)
    head = list(itertools.islice(rows, TABLE_ROWS + 1))
    if len(head) <= TABLE_ROWS:
        stdout.print(table(None, columns, head))
        return
    widths = [max(len(c), *(len(row[i]) for row in head)) for i, c in enumerate(columns)]
    aligned = "  ".join(f"{{:<{w}}}" for w in widths).format

    def line(values) -> str:
        return aligned(*values).rstrip() + "\n"

    out = sys.stdout
    out.write(line(columns))
    out.write("".join(line(v) for v in head))
    while batch := list(itertools.islice(rows, 8192)):
        out.write("".join(line(v) for v in batch))


@cli.command("encode-id")
@click.option(
    "--layout",
    type=click.Choice(["instagram", "pinterest", "snowflake"]),
    help="Encode with this layout instead of the topology's.",
)
@click.option("--epoch", help="Epoch for --layout (ISO-8601 or Unix ms).")
@click.option("--time", "at", help="The ID's time (ISO-8601, UTC if no offset).")
@click.option(
    "--ms", type=ASCII_INT, help="Milliseconds since the layout's epoch (instead of --time)."
)
@click.option("--shard", type=ASCII_INT, help="Shard number.")
@click.option("--sequence", type=ASCII_INT, help="Sequence (instagram, custom, snowflake).")
@click.option("--type", "type_", type=ASCII_INT, help="Type (pinterest).")
@click.option("--local", type=ASCII_INT, help="Local id (pinterest).")
@click.option("--worker", type=ASCII_INT, help="Worker (snowflake).")
@json_option
def encode_id(
    layout: str | None,
    epoch: str | None,
    at: str | None,
    ms: int | None,
    shard: int | None,
    sequence: int | None,
    type_: int | None,
    local: int | None,
    worker: int | None,
    as_json: bool,
) -> None:
    """Build an ID from its parts."""
    if epoch and not layout:
        raise BadInput("--epoch goes with --layout (the topology's IDs use the topology's epoch)")
    lay = _foreign_layout(layout, epoch) if layout else settings().topology().layout
    parts = {
        k: v
        for k, v in {
            "shard": shard,
            "sequence": sequence,
            "type": type_,
            "local": local,
            "worker": worker,
        }.items()
        if v is not None
    }
    if at is not None and ms is not None:
        raise BadInput("give --time or --ms, not both")
    if at is not None:
        try:
            parts["unix_ms"] = parse_epoch(at)
        except ValueError as exc:
            raise BadInput(f"--time: {exc}") from None
    elif ms is not None:
        parts["time"] = ms
    elif lay.has_time:
        raise BadInput(f"layout {lay.name} needs --time or --ms")
    value = lay.encode(**parts)
    decoded = lay.decode(value)
    emit(as_json, {"layout": lay.name, **decoded}, lambda: click.echo(str(decoded["id"])))


@cli.command()
@click.argument("key")
@flag_option("--string", "force_string", help="Treat the key as a string even if it is a number.")
@json_option
def locate(key: str, force_string: bool, as_json: bool) -> None:
    """Which shard, schema and host a routing key maps to."""
    topo = settings().topology()
    shard = shard_of_key(topo, key, force_string=force_string)
    host = topo.host_of(shard)
    kind = "string" if force_string or not is_integer_key(key) else "integer"
    rule = f"md5(key) mod {topo.modulus}" if kind == "string" else f"key % {topo.modulus}"
    adoption = topo.adoption
    if kind == "integer" and adoption is not None:  # an adopted fleet's integer keys are IDs
        old = adoption.is_old_id(int(key.strip()))
        rule = f"key % {topo.modulus}" if old else "the shard in its bits (a next_id() ID)"
        rule += f" (ID floor {adoption.id_floor})"
    schema = topo.schema_name(shard)
    if topo.adoption is not None and topo.adoption.on_source:
        # every shard is on the old database while it is authoritative, in the app's schema
        host, schema = topo.adoption.source, topo.adoption.schema
    doc = {
        "key": key,
        "kind": kind,
        "rule": rule,
        "shard": shard,
        "schema": schema,
        "host": host.name,
    }
    emit(as_json, doc, lambda: stdout.print(table(None, list(doc), [list(doc.values())])))


@cli.command()
@json_option
def info(as_json: bool) -> None:
    """Layout, its limits, and shards per host."""
    topo = settings().topology()
    doc = topo.summary()

    def human() -> None:
        lim = doc["limits"]
        stdout.print(
            table(
                "ID layout",
                ["layout", "bits (high→low)", "epoch", "function"],
                [[doc["layout"], doc["bits"], doc["epoch"], doc["function"]]],
            )
        )
        stdout.print(
            table(
                "Limits",
                ["max shards", "IDs per ms per shard", "IDs turn negative", "IDs overflow"],
                [
                    [
                        lim["max_shards"],
                        lim["ids_per_ms_per_shard"],
                        lim["negative_at"] or "never",
                        lim["overflow_at"],
                    ]
                ],
            )
        )
        stdout.print(
            table(
                f"{doc['shard_count']} shards, schema {doc['schema_format']}, "
                f"routing modulus {doc['routing_modulus']}",
                ["host", "dsn", "shards", "count"],
                [[h["name"], h["dsn"], h["shards"], h["shard_count"]] for h in doc["hosts"]],
            )
        )

    emit(as_json, doc, human)
