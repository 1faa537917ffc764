"""The code blocks of the README and docs/*.md, as the docs-as-tests run (tests/docs/) runs them.

A fenced block is runnable when its language is a shell (``sh``, ``bash``, ``console``) or
``python``; ``yaml`` blocks are loaded (and validated, when they are topologies). HTML comments on
the lines right above the fence (no blank line between) say how a block is treated:

* ``<!-- docs-test: REASON note -->`` leaves it out of the run, for one of the ``SKIPS`` reasons
  (a free note after the reason says more); an unknown reason is an error, not a silent skip;
* ``<!-- docs-test: check NAME -->`` runs it, then the run's check NAME, which asserts what the
  page says the block does (tests/docs/test_docs_run.py has the checks).

Other comments there (``<!-- topology: minimal -->``, ``<!-- example: NAME -->``) are left alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SHELLS = ("sh", "bash", "console")
RUNNABLE = (*SHELLS, "python")

# Why a block may stay out of the run. Each skip is listed by the run's report (tests/docs/).
SKIPS = {
    "excerpt": "part of a file or a program (names defined elsewhere, `...`): does not run alone",
    "external": "needs a host or service a local sandbox has not (a Docker engine, a registry)",
    "synopsis": "a command's usage with placeholders (DIR, [--option]), not a command to run",
    "ci": ".ci/run runs these exact commands itself (the install, the default suite)",
    "suite": "runs a test suite that the default suite already runs (named in the note)",
    "file": "the listing of a repository file (named in the note) that a test checks and runs",
}

FENCE = re.compile(r"^```([A-Za-z0-9_+-]*)[^\n]*$")
MARK = re.compile(r"^<!--\s*docs-test:\s*(?P<body>.*?)\s*-->\s*$")
COMMENT = re.compile(r"^<!--.*-->\s*$")


class MarkError(ValueError):
    """A ``docs-test`` comment that names no known reason or check."""


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository root: README.md, docs/router.md
    line: int  # the fence's line (1-based); the code starts on the next line
    lang: str
    text: str
    skip: str | None = None  # a key of SKIPS
    note: str = ""
    checks: tuple[str, ...] = field(default=())

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def runnable(self) -> bool:
        return self.lang in RUNNABLE and self.skip is None


def parse(text: str, page: str) -> list[Block]:
    """Every fenced block of a Markdown text, with the marks on the lines above it."""
    lines = text.splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start = i
        j = i + 1
        while j < len(lines) and lines[j].rstrip() != "```":
            j += 1
        if j == len(lines):
            raise MarkError(f"{page}:{start + 1}: a code block that never ends")
        skip, note, checks = _marks(lines, start, page)
        body = "\n".join(lines[start + 1 : j]) + "\n"
        out.append(Block(page, start + 1, m.group(1), body, skip, note, tuple(checks)))
        i = j + 1
    return out


def _marks(lines: list[str], fence: int, page: str) -> tuple[str | None, str, list[str]]:
    skip, note, checks = None, "", []
    k = fence - 1
    while k >= 0 and COMMENT.match(lines[k].strip()):
        m = MARK.match(lines[k].strip())
        if m:
            word, _, rest = m.group("body").partition(" ")
            if word == "check" and rest.strip():
                checks.insert(0, rest.strip())
            elif word in SKIPS and skip is None:
                skip, note = word, rest.strip()
            else:
                raise MarkError(
                    f"{page}:{k + 1}: docs-test mark {m.group('body')!r}: say one of "
                    f"{', '.join(SKIPS)} (with a note), or check NAME"
                )
        k -= 1
    return skip, note, checks


def pages(root: Path = ROOT) -> list[Path]:
    """The README and the hand-written pages of the site, in the run's order."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def page_blocks(path: Path, root: Path = ROOT) -> list[Block]:
    return parse(path.read_text(), path.relative_to(root).as_posix())
