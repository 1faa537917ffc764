"""Render the Jinja SQL templates: control schema, per-shard infrastructure, migrations."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import BadInput
from ..model.identifiers import quote_ident, quote_literal
from ..model.layouts import Layout, iso
from ..model.topology import Topology

# imported where a template is rendered: a command that renders nothing never pays for it
if TYPE_CHECKING:
    import jinja2

_PACKAGE = Path(__file__).resolve().parents[1]  # the shardctl package
NEXT_ID_BODY = re.compile(r"\$next_id\$(.*?)\$next_id\$", re.DOTALL)


@lru_cache(maxsize=8)  # a stat per call showed up when rendering 65,536 shards
def builtin_dir(name: str) -> Path:
    """Directory of the shipped ``templates`` or example ``migrations``.

    In a wheel they live in ``shardctl/_data``; in a source checkout, at the repository's top level.
    """
    packaged = _PACKAGE / "_data" / name
    if packaged.is_dir():
        return packaged
    return _PACKAGE.parent / name


def templates_dir(topo: Topology | None) -> Path:
    return topo.templates_dir if topo and topo.templates_dir else builtin_dir("templates")


@lru_cache(maxsize=16)
def _environment(search_path: tuple[str, ...]) -> jinja2.Environment:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(list(search_path)),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
    )
    env.filters["ident"] = _defined(quote_ident)
    env.filters["literal"] = _defined(quote_literal)
    return env


def _defined(quote):
    """A filter that lets StrictUndefined name the typo (``'shcema' is undefined``) before quoting."""
    from jinja2 import Undefined

    def apply(value):
        if isinstance(value, Undefined):
            value._fail_with_undefined_error()
        return quote(value)

    return apply


def environment(topo: Topology | None = None) -> jinja2.Environment:
    """Jinja environment over the topology's templates, falling back to the built-in ones."""
    paths = [str(templates_dir(topo))]
    builtin = str(builtin_dir("templates"))
    if builtin not in paths:
        paths.append(builtin)
    return _environment(tuple(paths))


def string_environment() -> jinja2.Environment:
    """Environment for rendering migration files given as text."""
    return _environment((str(builtin_dir("templates")),))


def layout_context(layout: Layout) -> dict:
    return dict(_layout_context(layout))  # a copy: a template may not change the cached one


@lru_cache(maxsize=16)
def _layout_context(layout: Layout) -> dict:
    return {
        "name": layout.name,
        "epoch": iso(layout.epoch),
        "epoch_ms": layout.epoch_ms,
        "time_bits": layout.bits("time"),
        "shard_bits": layout.bits("shard"),
        "sequence_bits": layout.bits("sequence"),
        "time_shift": layout.shift("time"),
        "shard_shift": layout.shift("shard"),
        "ids_per_ms": layout.ids_per_ms_per_shard,
        "max_shards": layout.max_shards,
    }


def shard_context(topo: Topology, shard: int) -> dict:
    """What every per-shard template and migration has in scope."""
    schema = topo.schema_name(shard)
    qualified = quote_ident(schema)
    return {
        "schema": schema,
        "shard_id": shard,
        "shard_count": topo.shard_count,
        "layout": layout_context(topo.layout),
        "function": topo.function,
        "next_id": f"{qualified}.next_id",
        "sequence": f"{qualified}.next_id_seq",
    }


def render_errors() -> tuple[type[BaseException], ...]:
    """What rendering a template can raise: jinja2's own errors, and Python errors from expressions
    such as {{ shard_id + "x" }} or {{ 1 // 0 }} (for ``except render_errors()``: jinja2 is imported by
    then)."""
    import jinja2

    return (
        jinja2.TemplateError,
        ArithmeticError,
        TypeError,
        ValueError,
        LookupError,
        AttributeError,
    )


def template_line(exc: BaseException, filename: str | None = None) -> int | None:
    """The template line an exception was raised from (jinja2 maps template frames to their lines)."""
    line = getattr(exc, "lineno", None)
    tb = exc.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if name == filename or (
            filename is None and (name == "<template>" or name.endswith(".j2"))
        ):
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _render(topo: Topology | None, name: str, context: dict) -> str:
    """Render template ``name``; a broken template is BadInput naming it (and its line), not a traceback."""
    try:
        template = environment(topo).get_template(name)
        return template.render(context)
    except render_errors() as exc:
        line = template_line(exc)
        where = f"{name}:{line}" if line else name
        message = getattr(exc, "message", None) or str(exc)
        raise BadInput(f"template {where} does not render: {message}") from None


def render_control(topo: Topology | None = None) -> str:
    return _render(topo, "control_schema.sql.j2", {})


def render_shard(topo: Topology, shard: int) -> str:
    """SQL that creates shard ``shard``: schema, sequence and ``next_id()``."""
    return _render(topo, "shard.sql.j2", shard_context(topo, shard))


def render_next_id(topo: Topology, shard: int) -> str:
    """Just the ``CREATE OR REPLACE FUNCTION … next_id()`` statement for a shard."""
    return _render(topo, f"next_id_{topo.function}.sql.j2", shard_context(topo, shard))


def next_id_body(function_sql: str) -> str:
    """The body between ``$next_id$`` quotes, as PostgreSQL stores it in ``pg_proc.prosrc``."""
    match = NEXT_ID_BODY.search(function_sql)
    if not match:
        raise ValueError("the next_id template must quote its body with $next_id$ … $next_id$")
    return match.group(1)


def render_host(
    topo: Topology,
    host_shards: list[int],
    *,
    control: bool = True,
    create: bool = True,
    migrations: list = (),
) -> dict:
    """What ``shardctl render`` shows for one host: ``{"control": SQL or None, "shards": {"n": SQL}}``,
    each shard's infrastructure (unless ``create`` is False) followed by its ``migrations``
    (``sql.migrations.Migration`` objects, rendered for the shard)."""
    shards: dict[str, str] = {}
    for n in host_shards:
        parts = [render_shard(topo, n)] if create else []
        parts += [f"-- migration {m.name}\n" + m.render(topo, n) for m in migrations]
        shards[str(n)] = "\n".join(parts)
    return {"control": render_control(topo) if control else None, "shards": shards}


def render_text(topo: Topology, hosts: dict[str, dict]) -> str:
    """``render_host`` documents (host name → document) as the SQL script ``shardctl render`` prints."""
    out = []
    for name, entry in hosts.items():
        out.append(f"-- ===== host {name} =====\n")
        if entry["control"]:
            out.append(entry["control"] + "\n")
        for n, text in entry["shards"].items():
            out.append(f"-- ----- shard {n} ({topo.schema_name(int(n))}) -----\n{text}\n")
    return "".join(out)
