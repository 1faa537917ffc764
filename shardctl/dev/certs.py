"""A certificate authority of the sandbox's own (``sandbox up --tls``), made with the ``openssl`` command.

``DIR/tls/`` holds the CA's key and certificate and one server certificate for ``127.0.0.1`` and
``localhost`` (every sandbox server listens there). The directory is the invoking user's alone
(0700): clients read ``ca.crt`` from it, the servers get copies of their own (their key and
certificate in the data directory, the CA as ``~/.postgresql/root.crt`` in their own HOME), so a
connection string that names the client's CA file never works on a server by accident.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from ..errors import OperationFailed

CA_DAYS = 3650
SERVER_DAYS = 825
_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
SERVER_EXTENSIONS = (
    "subjectAltName = IP:127.0.0.1, DNS:localhost\n"
    "basicConstraints = critical, CA:FALSE\n"
    "keyUsage = critical, digitalSignature, keyEncipherment\n"
    "extendedKeyUsage = serverAuth\n"
)


def _openssl(args: list[str], cwd: Path) -> None:
    exe = shutil.which("openssl")
    if exe is None:
        raise OperationFailed(
            "--tls needs the openssl command to make the sandbox's certificates "
            "(apt-get install openssl)"
        )
    proc = subprocess.run(
        [exe, *args], cwd=cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False
    )
    if proc.returncode != 0:
        raise OperationFailed(f"openssl {args[0]} failed: {proc.stderr.strip().splitlines()[-1:]}")


def ensure_ca(directory: Path) -> Path:
    """``directory`` (created 0700) with ``ca.crt``/``ca.key`` and ``server.crt``/``server.key``;
    files already there are kept. Returns the CA certificate's path."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    directory.chmod(0o700)
    if not (directory / "ca.crt").exists():
        _openssl(
            [
                "req",
                "-x509",
                "-new",
                *_KEY,
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-days",
                str(CA_DAYS),
                "-subj",
                "/CN=shardctl sandbox CA",
                "-addext",
                "basicConstraints = critical, CA:TRUE",
                "-addext",
                "keyUsage = critical, keyCertSign, cRLSign",
            ],
            directory,
        )
        (directory / "server.crt").unlink(missing_ok=True)
    if not (directory / "server.crt").exists():
        (directory / "server.ext").write_text(SERVER_EXTENSIONS)
        _openssl(
            [
                "req",
                "-new",
                *_KEY,
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                "/CN=localhost",
            ],
            directory,
        )
        _openssl(
            [
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-set_serial",
                str(int.from_bytes(os.urandom(8), "big")),
                "-days",
                str(SERVER_DAYS),
                "-extfile",
                "server.ext",
                "-out",
                "server.crt",
            ],
            directory,
        )
        (directory / "server.csr").unlink(missing_ok=True)
    for name in ("ca.key", "server.key"):
        (directory / name).chmod(0o600)
    return directory / "ca.crt"


def install_copy(source: Path, target: Path, user: str | None, mode: int = 0o600) -> None:
    """Copy ``source`` to ``target`` for the server user (owner ``user`` when we run as root)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    target.chmod(mode)
    if user:
        shutil.chown(target, user, user)
