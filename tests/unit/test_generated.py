"""The generated thread Router is what its one source, the asyncio Router, generates: a hand edit to
shardctl/router/_sync.py (or a source edit without ``make generate``) fails here."""

from __future__ import annotations

import ast
import textwrap

import pytest
from support.async_to_sync import PAIRS, ROOT, generate, translate


@pytest.mark.parametrize(("source", "target"), sorted(PAIRS.items()))
def test_generated_file_is_current(source, target):
    expected = generate(source, target)
    current = (ROOT / target).read_text()
    assert current == expected, (
        f"{target} is not what {source} generates: change {source}, then run `make generate`"
    )


@pytest.mark.parametrize(("source", "target"), sorted(PAIRS.items()))
def test_generated_file_has_nothing_async(source, target):
    tree = ast.parse((ROOT / target).read_text())
    found = [
        f"line {node.lineno}: {type(node).__name__}"
        for node in ast.walk(tree)
        if isinstance(node, (ast.AsyncFunctionDef, ast.AsyncWith, ast.AsyncFor, ast.Await))
        or (isinstance(node, ast.Name) and (node.id.startswith("Async") or node.id == "asyncio"))
    ]
    assert not found, found


def test_translation_keeps_comments_and_the_sync_branch():
    source = textwrap.dedent(
        '''\
        """Module doc."""
        import asyncio
        from collections.abc import AsyncIterator, Awaitable, Callable
        from contextlib import asynccontextmanager

        ASYNC = True


        class AsyncThing(AsyncRouter):
            """An AsyncRouter's thing: ``await x`` and ``async with y``."""

            @asynccontextmanager
            async def each(self, work: Callable[[], Awaitable[int]]) -> AsyncIterator[int]:
                async with self.lock:  # an AsyncRouter comment
                    if ASYNC:
                        await asyncio.sleep(0)  # only asyncio
                    else:
                        self.wake()  # only threads
                    async for row in self.rows():
                        yield await work()

            async def __aenter__(self) -> AsyncRouter:
                return self
        '''
    )
    out = translate(source, "Doc.")
    assert out == textwrap.dedent(
        '''\
        """Doc."""
        import asyncio
        from collections.abc import Iterator, Awaitable, Callable
        from contextlib import contextmanager



        class AsyncThing(Router):
            """An Router's thing: ``x`` and ``with y``."""

            @contextmanager
            def each(self, work: Callable[[], int]) -> Iterator[int]:
                with self.lock:  # an Router comment
                    self.wake()  # only threads
                    for row in self.rows():
                        yield work()

            def __enter__(self) -> Router:
                return self
        '''
    )


def test_a_stray_marker_is_refused():
    with pytest.raises(SyntaxError):
        translate("ASYNC = True\nx = ASYNC and 1\n")
