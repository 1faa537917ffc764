"""The FastAPI example served as a user runs it: uvicorn in a process of its own, on a free port, with
``SHARDCTL_CONFIG`` naming its topology file; and HTTP clients recording into a History."""

from __future__ import annotations

import itertools
import random
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from .history import History, now
from .process import REPO, process_env

FASTAPI_APP = REPO / "examples" / "fastapi_app"
SUPPORT = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def served(config: Path, app: str = "main:app", app_dir: Path = FASTAPI_APP) -> Iterator[str]:
    """``uvicorn app`` (from ``app_dir``, the example's directory on the path) serving the fleet of
    ``config``: its base URL, once it answers; stopped (SIGTERM: the lifespan closes the Router) after."""
    port = free_port()
    log = config.with_name(f"uvicorn-{port}.log")
    env = process_env({"SHARDCTL_CONFIG": str(config)})
    env["PYTHONPATH"] = f"{FASTAPI_APP}:{env['PYTHONPATH']}"
    argv = [sys.executable, "-m", "uvicorn", app, "--app-dir", str(app_dir), "--port", str(port)]
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*argv, "--host", "127.0.0.1", "--log-level", "warning"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=app_dir,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120  # imports take long on a loaded machine
        while True:
            assert proc.poll() is None, f"uvicorn exited {proc.returncode}: {log.read_text()}"
            try:
                if httpx.get(f"{url}/docs", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"uvicorn did not answer: {log.read_text()}"
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class WebTraffic:
    """HTTP clients of app servers (``apps``: name → base URL) until the block ends: per app, writers
    posting a photo for a key (a user ID) and readers asking the test route of ``fastapi_probe`` which
    schema answered a key's photos. A 503 (ShardMoved) is a documented retry, recorded under the app's
    name; any other answer but 200 is an error the application saw."""

    def __init__(
        self, history: History, apps: dict[str, str], keys: list[int], writers: int, readers: int
    ):
        self.history, self.keys = history, keys
        self._halt = threading.Event()
        ops = []
        for name, url in apps.items():
            ops += [(name, url, f"{name}-w{i}", self._write) for i in range(writers)]
            ops += [(name, url, f"{name}-r{i}", self._read) for i in range(readers)]
        self.clients = {client for _, _, client, _ in ops}
        self.threads = [threading.Thread(target=self._loop, args=op, daemon=True) for op in ops]

    def __enter__(self) -> WebTraffic:
        for thread in self.threads:
            thread.start()
        time.sleep(0.3)
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:  # the block ran: let the traffic outlast it
            self.history.settle(self.clients)
        self._halt.set()
        for thread in self.threads:
            thread.join(timeout=60)
        assert not any(thread.is_alive() for thread in self.threads)

    def _loop(self, app: str, url: str, client: str, op) -> None:
        rng = random.Random(client)
        # each client goes through every key in its own order, again and again: a slow machine's
        # few requests still write (and read) every key, which the tests check
        order = rng.sample(self.keys, len(self.keys))
        with httpx.Client(base_url=url, timeout=60) as http:
            for key in itertools.cycle(order):
                if self._halt.is_set():
                    break
                start = now()
                try:
                    response = op(http, client, key, start)
                except Exception as exc:  # noqa: BLE001 - every error the application sees is recorded
                    self.history.failed(client, op.__name__, key, exc, start, now())
                else:
                    if response.status_code == 503:
                        self.history.retried(app, op.__name__, key, response.text)
                    elif response.status_code != 200:
                        error = f"HTTP {response.status_code}: {response.text[:200]}"
                        self.history.failed(client, op.__name__, key, error, start, now())
                time.sleep(0.01)

    def _write(self, http: httpx.Client, client: str, key: int, start: float) -> httpx.Response:
        caption = {"caption": self.history.caption(client)}
        response = http.post(f"/users/{key}/photos", json=caption)
        if response.status_code == 200:
            self.history.acked(client, key, response.json()["id"], start, now())
        return response

    def _read(self, http: httpx.Client, client: str, key: int, start: float) -> httpx.Response:
        response = http.get(f"/_history/users/{key}/photos")
        if response.status_code == 200:
            doc = response.json()
            self.history.read(client, key, doc["schema"], doc["ids"], start, now())
        return response
