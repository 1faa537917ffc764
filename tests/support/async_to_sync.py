"""Generate the thread Router (shardctl/router/_sync.py) from its one source, the asyncio Router
(shardctl/router/_async.py): ``make generate``, or ``python tests/support/async_to_sync.py [--check]``.

The source is read with :mod:`ast`, and the generator edits its *text* at the positions the tree gives,
so that comments and layout survive: ``async def/with/for`` lose ``async``, ``await x`` becomes
``x``, ``Awaitable[T]`` becomes ``T``, the names of :data:`NAMES` (asyncio's and the source's own
``Async*`` names) become their thread twins, and an ``if ASYNC:`` statement keeps only its ``else``
branch (``if not ASYNC:`` keeps its body). Docstrings and comments get the same name map. ruff then
drops the imports nothing uses any more, sorts the rest, turns a re-yielding loop into ``yield from``
and formats the file.
tests/unit/test_generated.py fails when the checked-in file differs from what this prints.
"""

from __future__ import annotations

import ast
import difflib
import io
import re
import subprocess
import sys
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# source → generated file, relative to the repository
PAIRS = {"shardctl/router/_async.py": "shardctl/router/_sync.py"}

# asyncio names (and the source's own) → their thread twins; identifiers, attributes, imported names
# and definitions alike, and whole words in docstrings and comments
NAMES = {
    "AsyncRouter": "Router",
    "AsyncRouterConnection": "RouterConnection",
    "AsyncRouterCursor": "RouterCursor",
    "AsyncRouterClientCursor": "RouterClientCursor",
    "AsyncRouterServerCursor": "RouterServerCursor",
    "AsyncHostPool": "HostPool",
    "AsyncWatchdog": "Watchdog",
    "AsyncConnection": "Connection",
    "AsyncCursor": "Cursor",
    "AsyncClientCursor": "ClientCursor",
    "AsyncServerCursor": "ServerCursor",
    "AsyncTransaction": "Transaction",
    "AsyncIterator": "Iterator",
    "asynccontextmanager": "contextmanager",
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
}
# module.attribute → its thread twin
DOTTED = {("asyncio", "sleep"): "time.sleep"}
UNWRAPPED = {"Awaitable"}  # Awaitable[T] → T
MARKER = "ASYNC"  # `if ASYNC:` / `if not ASYNC:`; the source's `ASYNC = True` is dropped

_WORDS = re.compile(r"\b(" + "|".join(sorted(NAMES, key=len, reverse=True)) + r")\b")
_KEYWORDS = re.compile(r"\bawait\s+|\basync\s+(?=(?:with|for|def)\b)")


def header(source: str) -> str:
    return (
        f"# Generated from {source} by tests/support/async_to_sync.py (make generate): do not edit.\n"
        f"# Change {source} and run `make generate`; tests/unit/test_generated.py checks it.\n"
    )


class _Edits(ast.NodeVisitor):
    """The text edits (start, end, replacement), as byte offsets into the source."""

    def __init__(self, source: bytes):
        self.source = source
        self.lines = [0]
        for line in source.splitlines(keepends=True):
            self.lines.append(self.lines[-1] + len(line))
        self.edits: list[tuple[int, int, bytes]] = []

    # ---- positions ---------------------------------------------------------------------------
    def at(self, line: int, col: int) -> int:
        return self.lines[line - 1] + col

    def start(self, node: ast.AST) -> int:
        return self.at(node.lineno, node.col_offset)  # type: ignore[attr-defined]

    def end(self, node: ast.AST) -> int:
        return self.at(node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]

    def edit(self, start: int, end: int, text: str) -> None:
        self.edits.append((start, end, text.encode()))

    def drop_word(self, offset: int, word: str) -> None:
        """Delete ``word`` and the blanks after it at ``offset``."""
        match = re.compile(rb"%s\s+" % word.encode()).match(self.source, offset)
        if match is None:
            raise SyntaxError(f"expected {word!r} at byte {offset}")
        self.edit(match.start(), match.end(), "")

    def rename_after(self, offset: int, keyword: str, name: str) -> None:
        """Rename the definition ``keyword name`` found from ``offset`` (def, class)."""
        if name not in NAMES:
            return
        match = re.compile(rb"%s\s+(%s)\b" % (keyword.encode(), name.encode())).search(
            self.source, offset
        )
        assert match is not None, (keyword, name)
        self.edit(match.start(1), match.end(1), NAMES[name])

    def lines_of(self, body: list[ast.stmt]) -> tuple[int, int]:
        return self.lines[body[0].lineno - 1], self.lines[body[-1].end_lineno]  # type: ignore[index]

    def keep_block(self, node: ast.If, body: list[ast.stmt]) -> None:
        """Replace ``node`` (an ``if ASYNC`` statement) by ``body``, dedented to the statement's level."""
        first, last = self.lines_of([node])
        kept_first, kept_last = self.lines_of(body)
        self.edit(first, kept_first, "")
        self.edit(kept_last, last, "")
        indent = body[0].col_offset - node.col_offset
        for line in range(body[0].lineno, body[-1].end_lineno + 1):  # type: ignore[operator]
            offset = self.lines[line - 1]
            if self.source[offset : offset + indent].strip(b" ") == b"":
                width = min(indent, len(self.source[offset:].split(b"\n", 1)[0]))
                self.edit(offset, offset + width, "")
        for stmt in body:
            self.visit(stmt)

    # ---- the transform ------------------------------------------------------------------------
    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self.drop_word(self.start(node), "async")
        self.rename_after(self.start(node), "def", node.name)
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.rename_after(self.start(node), "def", node.name)
        self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.rename_after(self.start(node), "class", node.name)
        self.generic_visit(node)

    def visit_AsyncWith(self, node: ast.AsyncWith) -> None:
        self.drop_word(self.start(node), "async")
        self.generic_visit(node)

    def visit_AsyncFor(self, node: ast.AsyncFor) -> None:
        self.drop_word(self.start(node), "async")
        self.generic_visit(node)

    def visit_comprehension(self, node: ast.comprehension) -> None:
        if node.is_async:
            raise SyntaxError("async comprehensions are not translated: write a loop")
        self.generic_visit(node)

    def visit_Await(self, node: ast.Await) -> None:
        self.drop_word(self.start(node), "await")
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id == MARKER:
            raise SyntaxError(f"line {node.lineno}: {MARKER} only as `if {MARKER}:`")
        if node.id in NAMES:
            self.edit(self.start(node), self.end(node), NAMES[node.id])

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if isinstance(node.value, ast.Name) and (node.value.id, node.attr) in DOTTED:
            self.edit(self.start(node), self.end(node), DOTTED[node.value.id, node.attr])
            return
        if node.attr in NAMES:
            self.edit(self.end(node) - len(node.attr), self.end(node), NAMES[node.attr])
        self.visit(node.value)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if isinstance(node.value, ast.Name) and node.value.id in UNWRAPPED:
            self.edit(self.start(node), self.start(node.slice), "")
            self.edit(self.end(node.slice), self.end(node), "")
            self.visit(node.slice)
            return
        self.generic_visit(node)

    def visit_alias(self, node: ast.alias) -> None:
        if node.name in NAMES:
            self.edit(self.start(node), self.start(node) + len(node.name), NAMES[node.name])

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        if isinstance(test, ast.Name) and test.id == MARKER:
            if node.orelse:
                self.keep_block(node, node.orelse)
            else:
                first, last = self.lines_of([node])
                self.edit(first, last, "")
            return
        negated = isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
        if negated and isinstance(test.operand, ast.Name) and test.operand.id == MARKER:  # type: ignore[attr-defined]
            if node.orelse:
                raise SyntaxError(f"line {node.lineno}: write `if {MARKER}: ... else: ...`")
            self.keep_block(node, node.body)
            return
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        targets = node.targets
        if len(targets) == 1 and isinstance(targets[0], ast.Name) and targets[0].id == MARKER:
            first, last = self.lines_of([node])
            self.edit(first, last, "")
            return
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        return  # only docstrings are translated (visit_Expr)

    def visit_Expr(self, node: ast.Expr) -> None:
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            self.translate_text(self.start(node.value), self.end(node.value))
            return
        self.generic_visit(node)

    def translate_text(self, start: int, end: int) -> None:
        text = self.source[start:end].decode()
        new = _KEYWORDS.sub("", _WORDS.sub(lambda m: NAMES[m.group(1)], text))
        if new != text:
            self.edit(start, end, new)

    def comments(self) -> Iterator[tuple[int, int]]:
        for tok in tokenize.tokenize(io.BytesIO(self.source).readline):
            if tok.type == tokenize.COMMENT:
                line = self.source[self.lines[tok.start[0] - 1] : self.lines[tok.start[0]]]
                col = len(line.decode()[: tok.start[1]].encode())
                start = self.lines[tok.start[0] - 1] + col
                yield start, start + len(tok.string.encode())


def _module_docstring(tree: ast.Module) -> ast.Expr | None:
    first = tree.body[0] if tree.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        return first
    return None


def translate(source: str, docstring: str = "") -> str:
    """The thread twin of the asyncio ``source`` (before ruff), its module docstring ``docstring``."""
    data = source.encode()
    tree = ast.parse(data)
    edits = _Edits(data)
    doc = _module_docstring(tree)
    for stmt in tree.body:
        if stmt is not doc:
            edits.visit(stmt)
    if doc is not None:  # the source's docstring describes the source
        edits.edit(edits.start(doc), edits.end(doc), f'"""{docstring}"""')
    dropped = [(start, end) for start, end, text in edits.edits if not text]
    for start, end in edits.comments():
        if not any(s <= start < e for s, e in dropped):  # not in a dropped `if ASYNC:` branch
            edits.translate_text(start, end)
    out = bytearray(data)
    last = len(data) + 1
    for start, end, text in sorted((e for e in edits.edits if e[0] != e[1] or e[2]), reverse=True):
        if end > last:
            raise SyntaxError(f"overlapping edits at byte {start}: {data[start:end]!r}")
        out[start:end] = text
        last = start
    return out.decode()


def _ruff(args: list[str], text: str, path: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--stdin-filename", path, "-"],
        input=text,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    if proc.returncode not in (0, 1) or not proc.stdout:
        raise RuntimeError(f"ruff {' '.join(args)} failed on {path}:\n{proc.stderr}")
    return proc.stdout


def generate(source: str, target: str) -> str:
    """The generated text of ``target`` (both paths relative to the repository)."""
    doc = f"The thread twin of ``{Path(source).name}``, generated from it: see its docstring."
    text = header(source) + translate((ROOT / source).read_text(), doc)
    # imports nothing uses any more, import order, and `for x in it: yield x` (an async for) → yield from
    fixes = ["--select", "F401,I001,UP028", "--unsafe-fixes"]
    text = _ruff(["check", "--fix-only", *fixes, "--exit-zero"], text, target)
    return _ruff(["format"], text, target)


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for source, target in PAIRS.items():
        text = generate(source, target)
        path = ROOT / target
        current = path.read_text() if path.exists() else ""
        if current == text:
            continue
        if check:
            stale.append(target)
            sys.stdout.writelines(
                difflib.unified_diff(
                    current.splitlines(keepends=True),
                    text.splitlines(keepends=True),
                    target,
                    source,
                )
            )
        else:
            path.write_text(text)
            print(f"wrote {target}")
    if stale:
        print(f"\n{', '.join(stale)}: not generated from the source; run `make generate`")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
