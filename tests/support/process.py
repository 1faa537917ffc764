"""Running shardctl as a real process: the one helper every test uses for that.

(In-process runs go through ``support.fleet.run_cli``, click's CliRunner over the same entry point.)
A real process checks what CliRunner cannot: the exit status the shell sees, what the process
imports, and two runs at once. The process runs this checkout's code: the repository is put first
on PYTHONPATH, so an older installed shardctl cannot be picked up instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PYTHON_M = (sys.executable, "-m", "shardctl")


def console_script() -> str | None:
    """The installed ``shardctl`` console script next to this Python (else on PATH), or None."""
    script = Path(sys.executable).with_name("shardctl")
    return str(script) if script.exists() else shutil.which("shardctl")


def shardctl_argv(
    *args: Any,
    config: Path | str | None = None,
    command: tuple[str, ...] | list[str] = PYTHON_M,
    python_flags: tuple[str, ...] = (),
) -> list[str]:
    """The argument vector: ``command`` (default ``python -m shardctl``), then ``--config`` and ``args``."""
    argv = list(command)
    if python_flags:
        assert argv[:1] == [sys.executable], "python_flags need the python -m shardctl command"
        argv[1:1] = python_flags
    return argv + (["--config", str(config)] if config is not None else []) + [str(a) for a in args]


def process_env(env: dict[str, str] | None = None, unset: tuple[str, ...] = ()) -> dict[str, str]:
    """This process's environment, plus ``env``, minus ``unset``; the repository first on PYTHONPATH."""
    out = {k: v for k, v in os.environ.items() if k not in unset}
    out.update(env or {})
    out["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), out.get("PYTHONPATH")]))
    return out


def run_shardctl(
    *args: Any,
    config: Path | str | None = None,
    env: dict[str, str] | None = None,
    unset: tuple[str, ...] = (),
    input: str | None = None,
    cwd: Path | str | None = None,
    timeout: float = 120,
    command: tuple[str, ...] | list[str] = PYTHON_M,
    python_flags: tuple[str, ...] = (),
) -> subprocess.CompletedProcess:
    """Run shardctl to completion; text stdout and stderr captured."""
    return subprocess.run(
        shardctl_argv(*args, config=config, command=command, python_flags=python_flags),
        input=input,
        capture_output=True,
        text=True,
        env=process_env(env, unset),
        cwd=cwd,
        timeout=timeout,
        check=False,
    )


def start_shardctl(
    *args: Any,
    config: Path | str | None = None,
    env: dict[str, str] | None = None,
    unset: tuple[str, ...] = (),
    command: tuple[str, ...] | list[str] = PYTHON_M,
    text: bool = True,
) -> subprocess.Popen:
    """Start shardctl in the background (stdout and stderr piped); the caller waits or kills it."""
    return subprocess.Popen(
        shardctl_argv(*args, config=config, command=command),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=text,
        env=process_env(env, unset),
    )
