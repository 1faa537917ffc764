"""The docs-as-tests extractor and runner (tests/support/docs_blocks.py, docs_runner.py) without a
server: blocks are found with their lines, marks are honoured or refused, a page's blocks share one
shell and one Python session, and a failure names the page and the line. The real run over the
README and docs/ is tests/docs/ (``make test-docs``)."""

from __future__ import annotations

import re

import pytest
from support.docs_blocks import ROOT, SKIPS, MarkError, page_blocks, pages, parse
from support.docs_runner import BlockFailed, PageRun, shell_text

PAGE = """# A page

Text.

```sh
echo one
```

<!-- docs-test: excerpt the rest of settings.py -->
```python
x = 1
```

<!-- example: app -->
<!-- docs-test: external a Docker engine -->
```bash
docker ps
```

<!-- docs-test: check pooler -->
```console
$ shardctl status
pg1 ok
```

<!-- docs-test: excerpt -->

```python
y = 2
```

```yaml
a: 1
```
"""


def test_blocks_are_found_with_their_fence_lines_and_languages():
    blocks = parse(PAGE, "docs/page.md")
    assert [(b.line, b.lang) for b in blocks] == [
        (5, "sh"),
        (10, "python"),
        (16, "bash"),
        (21, "console"),
        (28, "python"),
        (32, "yaml"),
    ]
    assert blocks[0].text == "echo one\n"
    assert blocks[0].where == "docs/page.md:5"


def test_marks_on_the_lines_above_are_honoured():
    sh, excerpt, external, console, after_blank, yaml_block = parse(PAGE, "docs/page.md")
    assert sh.runnable and sh.skip is None
    assert (excerpt.skip, excerpt.note, excerpt.runnable) == (
        "excerpt",
        "the rest of settings.py",
        False,
    )
    assert external.skip == "external"  # another comment between the mark and the fence is fine
    assert console.runnable and console.checks == ("pooler",)
    assert after_blank.runnable  # a blank line ends the marks: that one belongs to no block
    assert not yaml_block.runnable


def test_console_blocks_run_their_prompt_lines_only_on_the_pages_lines():
    console = parse(PAGE, "docs/page.md")[3]
    assert shell_text(console) == "shardctl status\n\n"


@pytest.mark.parametrize(
    "mark", ["<!-- docs-test: exerpt -->", "<!-- docs-test: check -->", "<!-- docs-test: -->"]
)
def test_an_unknown_mark_is_refused_naming_its_line(mark):
    with pytest.raises(MarkError, match=r"^docs/page\.md:3: docs-test mark"):
        parse(f"# Page\n\n{mark}\n```sh\ntrue\n```\n", "docs/page.md")


def test_a_block_that_never_ends_is_refused():
    with pytest.raises(MarkError, match=r"docs/page\.md:2: a code block that never ends"):
        parse("x\n```sh\ntrue\n", "docs/page.md")


# ---- the real pages --------------------------------------------------------------------------


def every_block():
    return [b for page in pages() for b in page_blocks(page)]


def test_every_page_parses_and_its_runnable_blocks_run_or_say_why_not():
    blocks = every_block()
    assert {"README.md", "docs/router.md", "docs/testing.md"} <= {b.page for b in blocks}
    assert sum(b.runnable for b in blocks) >= 10, "the run would run next to nothing"
    for block in blocks:
        if block.skip:
            assert block.skip in SKIPS, block.where
            assert block.lang in ("sh", "bash", "console", "python"), (
                f"{block.where}: a docs-test mark on a {block.lang} block, which never runs"
            )


def test_ci_blocks_are_what_ci_runs():
    """A block marked ``ci`` is left out because .ci/run runs each of its commands as written."""
    run = {line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()}
    marked = [b for b in every_block() if b.skip == "ci"]
    assert marked, "no ci block: the README's install is one"
    for block in marked:
        for line in block.text.splitlines():
            for command in line.split(" #", 1)[0].split("&&"):
                assert command.strip() in run, f"{block.where}: .ci/run does not run {command!r}"


# ---- the runner, on pages of its own (bash and Python, no server) ----------------------------


def run_page(tmp_path, text):
    run = PageRun(tmp_path / "page")
    try:
        for block in parse(text, "docs/t.md"):
            if block.runnable:
                run.run(block, timeout=30)
    finally:
        run.close()
    return run


def test_a_pages_blocks_share_one_shell_and_the_python_session_follows_it(tmp_path):
    run = run_page(
        tmp_path,
        "```sh\nexport DOCS_X=41\nmkdir sub && cd sub\n```\n\n"
        "```python\nimport os\nn = int(os.environ['DOCS_X']) + 1\n```\n\n"
        "```python\nprint(n, os.getcwd())\n```\n\n"
        '```sh\necho "$DOCS_X $(pwd)"\n```\n',
    )
    assert run.output().split() == ["41", str(tmp_path / "page" / "sub")]
    python_out = min((tmp_path / "page" / ".docs-test").glob("003-*.out")).read_text()
    assert python_out.split() == ["42", str(tmp_path / "page" / "sub")]


def test_a_failing_shell_command_names_the_page_and_its_line(tmp_path):
    with pytest.raises(BlockFailed, match=r"^docs/t\.md:4: the sh block at line 2 .*exit 3") as e:
        run_page(tmp_path, "\n```sh\ntrue\n(exit 3)\necho after\n```\n")
    assert "after" in str(e.value)  # its output comes with it


def test_a_failing_python_block_names_the_page_and_its_line(tmp_path):
    with pytest.raises(BlockFailed, match=r"^docs/t\.md:3: the python block at line 1") as e:
        run_page(tmp_path, "```python\nx = 1\nprint(user_id)\n```\n")
    assert re.search(
        r'File "docs/t\.md", line 3.*\n +print\(user_id\)\n.*NameError', str(e.value), re.DOTALL
    )


def test_a_block_over_its_time_is_stopped(tmp_path):
    run = PageRun(tmp_path / "page")
    [block] = parse("```sh\nsleep 30\n```\n", "docs/t.md")
    try:
        with pytest.raises(BlockFailed, match=r"docs/t\.md:1: .*still running after 1 s"):
            run.run(block, timeout=1)
    finally:
        run.close()


def test_ci_runs_the_docs_after_the_default_suite_which_leaves_them_out():
    run = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert run.index("make test-docs") > run.index("python -m pytest -q")
    pyproject = (ROOT / "pyproject.toml").read_text()  # tomllib is Python 3.11+
    assert re.search(r"^addopts = \"-m 'not slow and not docs' ", pyproject, re.MULTILINE)
    assert re.search(r'^    "docs: ', pyproject, re.MULTILINE), "the docs marker is not registered"
    make = (ROOT / "Makefile").read_text().split("\ntest-docs:\n", 1)[1].split("\n\n", 1)[0]
    assert "-m docs" in make and "tests/docs" in make, make
