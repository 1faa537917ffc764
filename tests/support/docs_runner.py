"""Run one documentation page's blocks as a reader would (the docs-as-tests run, tests/docs/).

Each page gets a directory of its own, one shell session (bash) and one Python session
(tests/support/docs_python.py) for all its blocks, in order. The Python session follows the shell:
each Python block runs in the directory and with the environment the shell blocks before it left
(a reader's ``export SHARDCTL_CONFIG=...`` then ``python``). A block fails on the first command that
fails (the shell's ERR trap names its line), an exception, or its time limit; the failure names the
page and the line. After the page, every sandbox its blocks started (a ``sandbox.json`` under the
page's directory) is stopped with ``shardctl sandbox down``.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import yaml

from .docs_blocks import SHELLS, Block

DRIVER = Path(__file__).with_name("docs_python.py")
BLOCK_SECONDS = 240.0
TAIL = 3000  # characters of a failing block's output in the failure message


class BlockFailed(AssertionError):
    """A block did not run as written: the message names the page and the line."""


class PageRun:
    """The sessions of one page, in ``directory``; ``close()`` stops them and the page's sandboxes."""

    def __init__(self, directory: Path, env: dict[str, str] | None = None):
        self.dir = directory
        self.work = (
            directory / ".docs-test"
        )  # the blocks' files, their output and the shell's state
        self.work.mkdir(parents=True)
        base = dict(os.environ if env is None else env)
        base.pop("SHARDCTL_CONFIG", None)  # a reader starts with no fleet chosen
        self.env = base
        self.cwd = str(directory)
        self._shell: subprocess.Popen | None = None
        self._python: subprocess.Popen | None = None
        self._n = 0
        self.last_out: Path | None = None

    def output(self) -> str:
        """What the last block printed on stdout."""
        return self.last_out.read_text(errors="replace") if self.last_out else ""

    # ---- running blocks ---------------------------------------------------------------------

    def run(self, block: Block, timeout: float = BLOCK_SECONDS) -> None:
        self._n += 1
        if block.lang in SHELLS:
            self._run_shell(block, timeout)
        elif block.lang == "python":
            self._run_python(block, timeout)
        elif block.lang == "yaml":
            load_yaml(block)

    def _files(self, block: Block, suffix: str) -> tuple[Path, Path]:
        stem = f"{self._n:03d}-line{block.line}"
        self.last_out = self.work / f"{stem}.out"  # stdout; stderr beside it, in .err
        return self.work / f"{stem}.{suffix}", self.last_out

    def _run_shell(self, block: Block, timeout: float) -> None:
        script, out = self._files(block, "sh")
        script.write_text(shell_text(block))
        status = self.work / f"{self._n:03d}.status"
        shell = self._shell_session()
        assert shell.stdin is not None
        shell.stdin.write(
            "__docs_errs=''\n"
            "trap '__docs_errs=\"$__docs_errs $LINENO:$?\"' ERR\n"
            f"source {script} > {out} 2> {out.with_suffix('.err')} < /dev/null\n"
            "__docs_rc=$?\n"
            "trap - ERR\n"
            f"pwd > {self.work}/cwd; env -0 > {self.work}/env\n"
            f'echo "$__docs_rc $__docs_errs" > {status}.tmp && mv {status}.tmp {status}\n'
        )
        shell.stdin.flush()
        deadline = time.monotonic() + timeout
        while not status.exists():
            if shell.poll() is not None:
                raise self._failure(block, out, f"the shell exited ({shell.returncode})")
            if time.monotonic() > deadline:
                self._kill(shell)
                self._shell = None
                raise self._failure(block, out, f"still running after {timeout:.0f} s")
            time.sleep(0.05)
        rc, *errors = status.read_text().split()
        self.cwd = (self.work / "cwd").read_text().strip()
        env = (self.work / "env").read_bytes().split(b"\0")
        self.env = dict(e.decode().split("=", 1) for e in env if b"=" in e)
        if errors or rc != "0":
            first = errors[0].split(":") if errors else ["?", rc]
            line = block.line + int(first[0]) if first[0].isdigit() else block.line
            raise self._failure(block, out, f"exit {first[1]}", line=line)

    def _shell_session(self) -> subprocess.Popen:
        if self._shell is None or self._shell.poll() is not None:
            self._shell = subprocess.Popen(
                ["bash", "--noprofile", "--norc"],
                stdin=subprocess.PIPE,
                stdout=open(self.work / "shell.log", "ab"),  # noqa: SIM115 (the session owns it)
                stderr=subprocess.STDOUT,
                cwd=self.cwd,
                env=self.env,
                text=True,
                start_new_session=True,
            )
        return self._shell

    def _run_python(self, block: Block, timeout: float) -> None:
        _, out = self._files(block, "py")
        python = self._python_session()
        assert python.stdin is not None and python.stdout is not None
        job = {"code": block.text, "page": block.page, "line": block.line, "out": str(out)}
        job["err"] = str(out.with_suffix(".err"))
        python.stdin.write(json.dumps({**job, "cwd": self.cwd, "env": self.env}) + "\n")
        python.stdin.flush()
        ready, _, _ = select.select([python.stdout], [], [], timeout)
        if not ready:
            self._kill(python)
            self._python = None
            raise self._failure(block, out, f"still running after {timeout:.0f} s")
        answer = python.stdout.readline()
        if not answer:
            self._python = None
            raise self._failure(block, out, f"the Python session exited ({python.wait()})")
        result = json.loads(answer)
        if not result["ok"]:
            raise self._failure(block, out, result["error"].rstrip(), line=result.get("line"))

    def _python_session(self) -> subprocess.Popen:
        if self._python is None or self._python.poll() is not None:
            self._python = subprocess.Popen(
                [sys.executable, str(DRIVER)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=open(self.work / "python.log", "ab"),  # noqa: SIM115
                cwd=self.cwd,
                env=self.env,
                text=True,
                start_new_session=True,
            )
        return self._python

    def _failure(self, block: Block, out: Path, why: str, line: int | None = None) -> BlockFailed:
        output = [
            f"--- its {name} ---\n{path.read_text(errors='replace')[-TAIL:]}"
            for name, path in (("stderr", out.with_suffix(".err")), ("stdout", out))
            if path.exists() and path.stat().st_size
        ]
        return BlockFailed(
            f"{block.page}:{line or block.line}: the {block.lang} block at line {block.line} "
            f"does not run as written: {why}\n" + "\n".join(output)
        )

    # ---- the end of a page --------------------------------------------------------------------

    def close(self) -> list[str]:
        """Stop the sessions and every sandbox under the page's directory; the problems, if any."""
        problems = []
        for proc in (self._shell, self._python):
            if proc is not None:
                self._stop(proc)
        for state in sorted(self.dir.rglob("sandbox.json")):
            down = subprocess.run(
                ["shardctl", "sandbox", "down", "--dir", str(state.parent)],
                env={**self.env, "PATH": os.environ["PATH"]},
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            if down.returncode != 0:
                problems.append(f"sandbox down --dir {state.parent}: {down.stderr.strip()}")
        return problems

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    @staticmethod
    def _stop(proc: subprocess.Popen) -> None:
        if proc.stdin is not None and not proc.stdin.closed:
            try:
                proc.stdin.close()
            except OSError:
                pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def shell_text(block: Block) -> str:
    """What the shell runs: the block itself; for ``console``, its ``$ `` lines only (other lines
    are output), blanked so that line numbers stay the page's."""
    if block.lang != "console":
        return block.text
    return "".join(
        (line[2:] if line.startswith("$ ") else "") + "\n" for line in block.text.splitlines()
    )


def load_yaml(block: Block) -> None:
    """A YAML block loads; one with ``version`` is a topology and validates."""
    from shardctl.model.topology import Topology

    try:
        data = yaml.safe_load(block.text)
        if isinstance(data, dict) and "version" in data:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                Topology.from_text(block.text, path=block.where)
    except Exception as exc:
        raise BlockFailed(f"{block.where}: the yaml block does not load: {exc}") from exc


def remove(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)
