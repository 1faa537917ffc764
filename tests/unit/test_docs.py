"""The README and the documentation site (docs/, mkdocs.yml) document the CLI as it is (like
sqlite-utils' test_docs.py).

* every command has a row in the README's command table, and the table has no row for a command
  that does not exist; every sub-command is named in the README;
* every command and every option has help text (``shardctl CMD --help``), and the generated CLI
  reference (docs/hooks/shardctl_docs.py) names every command and option;
* every option group (an option several commands share, and the global options) is named in the
  hand-written pages;
* the README is a landing page (at most 1,500 words) whose install and test commands are the ones
  .ci/run runs;
* links between the README, docs/ and the repository's files resolve, anchors included; every page
  is in mkdocs.yml's nav;
* code blocks are true: Python parses, YAML loads (topologies validate), and every ``shardctl`` line
  of a shell block names real commands and options.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import shlex
import warnings
from collections import defaultdict
from pathlib import Path

import click
import pytest
import yaml
from markdown.extensions.toc import slugify

from shardctl.cli import cli, load_commands
from shardctl.model.topology import Topology

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
# The hand-written pages (cli.md's reference part and changelog.md are made at build time).
PAGES = {
    p.relative_to(ROOT / "docs").as_posix(): p.read_text()
    for p in sorted((ROOT / "docs").glob("*.md"))
}
DOCS = "\n".join(PAGES.values())


def walk(command: click.Command, path: tuple[str, ...]):
    yield " ".join(path), command
    if isinstance(command, click.Group):
        for name, sub in sorted(command.commands.items()):
            yield from walk(sub, (*path, name))


COMMANDS = dict(
    item for name, command in load_commands().items() for item in walk(command, (name,))
)
TOP = sorted(load_commands())


def option_name(option: click.Option) -> str:
    return max(option.opts, key=len)


def options(command: click.Command) -> list[click.Option]:
    return [p for p in command.params if isinstance(p, click.Option) and option_name(p) != "--help"]


def shared_options() -> dict[str, list[str]]:
    """Options that two or more commands take (the option groups), with the commands taking them."""
    users = defaultdict(list)
    for path, command in COMMANDS.items():
        for option in options(command):
            users[option_name(option)].append(path)
    return {name: paths for name, paths in users.items() if len(paths) > 1}


def table_commands() -> list[str]:
    """The first word of each row of the table under "## Commands"."""
    section = README.split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
    return [m.group(1) for m in re.finditer(r"^\| `([a-z-]+)", section, re.MULTILINE)]


def test_command_table_lists_every_command_once():
    rows = table_commands()
    assert sorted(set(rows)) == TOP, (
        f"README command table: missing {sorted(set(TOP) - set(rows))}, "
        f"unknown {sorted(set(rows) - set(TOP))}"
    )
    assert len(rows) == len(set(rows)), "a command has two rows"


@pytest.mark.parametrize("path", [p for p in COMMANDS if " " in p])
def test_sub_command_is_named_in_readme(path):
    assert f"`{path}" in README or f"shardctl {path}" in README, path


@pytest.mark.parametrize("path", list(COMMANDS))
def test_command_has_help(path):
    command = COMMANDS[path]
    assert (command.help or "").strip(), f"shardctl {path} has no help text"
    assert command.get_short_help_str().strip()


@pytest.mark.parametrize("path", list(COMMANDS))
def test_every_option_has_help(path):
    missing = [option_name(o) for o in options(COMMANDS[path]) if not (o.help or "").strip()]
    assert not missing, f"shardctl {path}: options without help text: {missing}"


def test_global_options_have_help_and_are_documented():
    for option in options(cli):
        assert (option.help or "").strip(), option_name(option)
        assert f"`{option_name(option)}" in DOCS, (
            f"global option {option_name(option)} is not in docs/"
        )


@pytest.mark.parametrize("name", sorted(shared_options()))
def test_option_group_is_documented(name):
    assert re.search(rf"`{re.escape(name)}\b", DOCS), (
        f"{name} (taken by {', '.join(shared_options()[name])}) is not named in docs/"
    )


def test_the_checks_see_the_cli():
    """The lists the tests above go through are the real ones (so those tests can fail)."""
    assert {"decode-id", "move-shard", "rebalance", "sandbox", "sandbox up"} <= set(COMMANDS)
    assert {"--json", "--connect-timeout", "--batch-size"} <= set(shared_options())
    assert "init" in table_commands()


# ---- the landing page ----------------------------------------------------------------------------


def test_readme_is_a_landing_page():
    words = len(re.sub(r"[`|*#>\-]", " ", README).split())
    assert words <= 1500, f"README.md has {words} words; the reference belongs in docs/"


def code_blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, re.MULTILINE | re.DOTALL)


def test_ci_runs_the_readmes_install_and_test_commands():
    """.ci/run installs as the README says and runs the README's test command."""
    run = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    setup = README.split("\n## Set up\n", 1)[1].split("\n## ", 1)[0]
    commands = [
        command.strip()
        for block in code_blocks(setup, "sh")
        for line in block.splitlines()
        for command in line.split("#")[0].split("&&")
    ]
    assert commands == [
        "python3 -m venv .venv",
        ". .venv/bin/activate",
        "pip install -e '.[dev]'",
        "python -m pytest -q",
    ], commands
    assert all(command in run for command in commands), commands
    assert run.index("mkdocs build --strict") < run.index("python -m pytest -q")


# ---- links and anchors ---------------------------------------------------------------------------


def anchors(text: str) -> set[str]:
    """The ids MkDocs (Python-Markdown's toc) gives the headings of a page; GitHub's agree for these."""
    found = set()
    for m in re.finditer(r"^#{1,6} (.+)$", code_free(text), re.MULTILINE):
        found.add(slugify(re.sub(r"[`*]", "", m.group(1)).strip(), "-"))
    return found


def code_free(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)


def links(text: str) -> list[str]:
    return re.findall(r"\]\(([^)\s]+)\)", code_free(text))


def documents() -> list[tuple[Path, str]]:
    return [(ROOT / "README.md", README)] + [
        (ROOT / "docs" / name, text) for name, text in PAGES.items()
    ]


@pytest.mark.parametrize(
    "path,text", documents(), ids=lambda v: v.name if isinstance(v, Path) else ""
)
def test_links_resolve(path, text):
    generated = {ROOT / "docs" / "changelog.md": (ROOT / "CHANGELOG.md").read_text()}
    for link in links(text):
        if re.match(r"[a-z]+:", link):
            continue  # https:, mailto:
        target, _, anchor = link.partition("#")
        file = (path.parent / target).resolve() if target else path
        if path.parent == ROOT / "docs":
            assert file.parent == ROOT / "docs", (
                f"{path.name}: {link} leaves docs/ (mkdocs --strict refuses it)"
            )
        assert file.exists() or file in generated, f"{path.name}: {link}: no such file"
        if anchor and file.suffix == ".md":
            body = generated.get(file) or file.read_text()
            assert anchor in anchors(body), (
                f"{path.name}: {link}: no heading with that anchor in {file.name}"
            )


def test_every_page_is_in_the_nav():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = [next(iter(item.values())) for item in config["nav"]]
    assert sorted(nav) == sorted([*PAGES, "changelog.md"]), nav
    assert (ROOT / "CHANGELOG.md").read_text().startswith("# Changelog")


def test_the_changelog_is_linked_from_the_docs():
    assert "](changelog.md)" in PAGES["index.md"] and "](CHANGELOG.md)" in README


# ---- code blocks ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path,text", documents(), ids=lambda v: v.name if isinstance(v, Path) else ""
)
def test_python_blocks_parse(path, text):
    for block in code_blocks(text, "python"):
        try:
            ast.parse(block)
        except SyntaxError as exc:
            pytest.fail(f"{path.name}: a python block does not parse: {exc}\n{block}")


@pytest.mark.parametrize(
    "path,text", documents(), ids=lambda v: v.name if isinstance(v, Path) else ""
)
def test_yaml_blocks_load_and_topologies_validate(path, text):
    for block in code_blocks(text, "yaml"):
        data = yaml.safe_load(block)
        if isinstance(data, dict) and "version" in data:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                Topology.from_text(block, path=str(path))  # raises ConfigError naming the line


def test_the_readmes_minimal_topology_validates():
    block = README.split("<!-- topology: minimal -->", 1)[1]
    assert code_blocks(block, "yaml"), "the README's minimal topology is missing"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        topo = Topology.from_text(code_blocks(block, "yaml")[0])
    assert len(topo.hosts) == 2


GLOBAL = {n for o in options(cli) for n in o.opts} | {"--help", "--version"}


def shell_lines(text: str) -> list[str]:
    lines = []
    for block in code_blocks(text, "sh"):
        for line in block.splitlines():
            line = line.split(" #", 1)[0].strip()
            for part in re.split(r"&&|\|", line):
                part = part.strip()
                if part.startswith("shardctl "):
                    lines.append(part)
    return lines


@pytest.mark.parametrize(
    "path,text", documents(), ids=lambda v: v.name if isinstance(v, Path) else ""
)
def test_shell_examples_name_real_commands_and_options(path, text):
    for line in shell_lines(text):
        words = shlex.split(line.replace("[", " ").replace("]", " "))[1:]
        command_path: list[str] = []
        for word in words:
            if word.startswith("-"):
                continue
            if " ".join([*command_path, word]) in COMMANDS:
                command_path.append(word)
            elif command_path:
                break
        assert command_path, f"{path.name}: {line!r} names no shardctl command"
        command = COMMANDS[" ".join(command_path)]
        known = GLOBAL | {n for p in command.params for n in getattr(p, "opts", [])}
        for word in words:
            name = word.split("=", 1)[0]
            if name.startswith("-") and not re.fullmatch(r"-\d.*", name):
                assert name in known, (
                    f"{path.name}: {line!r}: shardctl {' '.join(command_path)} has no {name}"
                )


# ---- the generated CLI reference ------------------------------------------------------------------


def load_hook():
    spec = importlib.util.spec_from_file_location(
        "shardctl_docs", ROOT / "docs" / "hooks" / "shardctl_docs.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_reference_is_generated_from_every_command_and_option():
    hook = load_hook()
    assert hook.MARKER in PAGES["cli.md"]
    reference = hook.cli_reference()
    for path, command in COMMANDS.items():
        assert f"`shardctl {path}`" in reference, path
        for option in options(command):
            assert option_name(option) in reference, f"shardctl {path} {option_name(option)}"
