"""A rich progress bar per host, drawn on stderr; silent with --json or when stderr is not a terminal."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from .output import stderr


@contextmanager
def host_progress(
    label: str, enabled: bool = True
) -> Iterator[Callable[[str, int], Callable[[int], None]] | None]:
    """Yields a factory ``(host, total) -> tick(n)`` for the library, or None when disabled."""
    if not enabled or not stderr.is_terminal:
        yield None
        return
    # Imported here: a command without a bar (--json, --check, not a terminal) does not pay for it.
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn(f"{label} [bold]{{task.description}}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=stderr,
        transient=False,
    ) as bar:

        def factory(host: str, total: int) -> Callable[[int], None]:
            task = bar.add_task(host, total=max(total, 1), completed=0 if total else 1)
            return lambda n: bar.advance(task, n)

        yield factory
