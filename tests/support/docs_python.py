"""One page's Python session for the docs-as-tests run (tests/support/docs_runner.py starts it).

A reader pastes a page's Python blocks into one interpreter, so every block of a page runs in one
namespace, in the page's directory and environment as the page's shell left them. Requests come as
JSON lines on stdin; each answer is one JSON line on the file descriptor this process was started
with as stdout. The blocks' own output (and their child processes') goes to a file per block.
"""

from __future__ import annotations

import ast
import json
import linecache
import os
import sys
import traceback
import types


def main() -> None:
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    # The blocks' module is ``__main__``, as a script's is: libraries that resolve a class's names
    # through ``sys.modules[cls.__module__]`` (SQLAlchemy's ``Mapped[...]`` annotations) find them.
    main_module = types.ModuleType("__main__")
    sys.modules["__main__"] = main_module
    namespace = main_module.__dict__
    for request in sys.stdin:
        job = json.loads(request)
        os.chdir(job["cwd"])
        os.environ.clear()
        os.environ.update(job["env"])
        if job["cwd"] not in sys.path:
            sys.path.insert(0, job["cwd"])
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, name in ((1, "out"), (2, "err")):
            file = os.open(job[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(file, fd)
            os.close(file)
        try:
            lines = ["\n"] * job["line"] + job["code"].splitlines(keepends=True)
            linecache.cache[job["page"]] = (len("".join(lines)), None, lines, job["page"])
            tree = ast.parse(job["code"], job["page"])
            ast.increment_lineno(tree, job["line"])  # tracebacks name the page's own lines
            exec(compile(tree, job["page"], "exec"), namespace)  # noqa: S102
            answer = {"ok": True}
        except BaseException as exc:  # noqa: BLE001 (a block's failure, whatever it is, is the finding)
            frames = exc.__traceback__.tb_next if exc.__traceback__ else None  # not this loop's
            error = "".join(traceback.format_exception(type(exc), exc, frames))
            lines_in_page = [
                tb.tb_lineno
                for tb in _walk(exc.__traceback__)
                if tb.tb_frame.f_code.co_filename == job["page"]
            ]
            answer = {"ok": False, "error": error, "line": (lines_in_page or [None])[-1]}
        sys.stdout.flush()
        sys.stderr.flush()
        answers.write(json.dumps(answer) + "\n")


def _walk(tb):
    while tb is not None:
        yield tb
        tb = tb.tb_next


if __name__ == "__main__":
    main()
