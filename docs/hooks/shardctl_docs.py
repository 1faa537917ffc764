"""MkDocs hooks (mkdocs.yml ``hooks:``) that build two pages from the repository at build time.

* ``cli.md``: the marker ``<!-- cli-reference -->`` is replaced by a reference written from the Click
  commands themselves (``shardctl.cli``): every command and sub-command, its usage, help text and every
  option with its help, default and choices. No option is copied by hand, so the page cannot drift.
* ``changelog.md``: the root ``CHANGELOG.md``, as a page of the site.

``cli_reference()`` is also what tests/unit/test_docs.py checks.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- cli-reference -->"


def _walk(command: click.Command, path: tuple[str, ...], ctx: click.Context):
    yield path, command, ctx
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                yield from _walk(sub, (*path, name), click.Context(sub, info_name=name, parent=ctx))


def _cell(text: str) -> str:
    return " ".join((text or "").split()).replace("|", "\\|")


def _param_row(param: click.Parameter, ctx: click.Context) -> str | None:
    record = param.get_help_record(ctx)
    if record is None:
        return None
    names, help_text = record
    return f"| `{_cell(names)}` | {_cell(help_text)} |"


def _section(path: tuple[str, ...], command: click.Command, ctx: click.Context) -> str:
    title = " ".join(path)
    level = "###" if len(path) <= 2 else "####"
    out = [f"{level} `{title}`", ""]
    usage = " ".join(command.collect_usage_pieces(ctx))
    out += ["```text", f"{title} {usage}".rstrip(), "```", ""]
    out += [_help(command.help or ""), ""]
    arguments = [p for p in command.params if isinstance(p, click.Argument)]
    if arguments:
        out += [
            "Arguments: "
            + ", ".join(
                f"`{p.make_metavar(ctx) if _takes_ctx(p) else p.make_metavar()}`" for p in arguments
            ),
            "",
        ]
    rows = [
        row
        for p in command.get_params(ctx)
        if isinstance(p, click.Option)
        if (row := _param_row(p, ctx)) is not None
    ]
    if rows:
        out += ["| option | what it does |", "|---|---|", *rows, ""]
    if isinstance(command, click.Group):
        subs = [(n, command.get_command(ctx, n)) for n in command.list_commands(ctx)]
        out += ["| command | what it does |", "|---|---|"]
        out += [
            f"| `{title} {n}` | {_cell(c.get_short_help_str(120))} |"
            for n, c in subs
            if c is not None
        ]
        out += [""]
    return "\n".join(out)


def _help(text: str) -> str:
    """Click help as Markdown: a paragraph that starts with Click's ``\\b`` marker keeps its line
    breaks in ``--help``, so it becomes a text block here; ``\\f`` ends what ``--help`` shows."""
    paragraphs = inspect.cleandoc(text.split("\f", 1)[0]).split("\n\n")
    out = []
    for paragraph in paragraphs:
        lines = paragraph.splitlines()
        if lines and lines[0].strip() == "\b":
            out.append("\n".join(["```text", *lines[1:], "```"]))
        else:
            out.append(paragraph)
    return "\n\n".join(out)


def _takes_ctx(param: click.Parameter) -> bool:
    return "ctx" in inspect.signature(param.make_metavar).parameters


def cli_reference() -> str:
    """Markdown for every shardctl command, from the Click objects."""
    from shardctl.cli import cli

    root = click.Context(cli, info_name="shardctl")
    return "\n".join(
        _section(path, command, ctx) for path, command, ctx in _walk(cli, ("shardctl",), root)
    )


def on_files(files, config):
    from mkdocs.structure.files import File

    changelog = (ROOT / "CHANGELOG.md").read_text()
    files.append(File.generated(config, "changelog.md", content=changelog))
    return files


def on_page_markdown(markdown: str, page, config, files):
    if page.file.src_uri == "cli.md":
        return markdown.replace(MARKER, cli_reference())
    return markdown
