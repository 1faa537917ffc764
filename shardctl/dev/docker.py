"""The Docker engine of the sandbox: N PostgreSQL containers started through testcontainers.

Every object it creates (containers, their data volumes, one network) carries the labels
``io.shardctl.sandbox`` (an id kept in the sandbox directory) and ``io.shardctl.sandbox.dir``,
so ``status``/``down``/``down --destroy`` find exactly this sandbox's objects. The sandbox
outlives the ``shardctl`` process that made it, so the testcontainers reaper (Ryuk) is never
used: it would remove the containers when the process exits, and it needs a pulled image.

Containers publish PostgreSQL on 127.0.0.1 (``dsn``); on their own network they reach each
other by host name (``peer_dsn``), which is what shard moves' subscriptions use.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import BadInput, OperationFailed
from ..model.dsn import mask
from ..sql.session import SERVER_VERSION
from . import base
from .process import free_port
from .sandbox import Sandbox
from .servers import SERVER_SETTINGS

STATE_FILE = "docker.json"
DEFAULT_IMAGE = "postgres:18"
LABEL = "io.shardctl.sandbox"
LABEL_DIR = "io.shardctl.sandbox.dir"
LABEL_HOST = "io.shardctl.sandbox.host"
PG_PORT = 5432
# The data volume is mounted at /var/lib/postgresql, the VOLUME of postgres:18 and of the image
# examples/docker builds; PGDATA lives below it (postgres:18 wants a versioned subdirectory).
VOLUME_PATH = "/var/lib/postgresql"
PGDATA = "/var/lib/postgresql/shardctl"
# Settings the container command line sets (listening and sockets stay as the image has them).
CONTAINER_SETTINGS = {
    k: v.strip("'")
    for k, v in SERVER_SETTINGS.items()
    if k not in ("listen_addresses", "unix_socket_directories")
}


@dataclass
class DockerHost:
    name: str
    port: int
    container: str = ""
    volume: str = ""

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{base.DATABASE}"

    @property
    def peer_dsn(self) -> str:
        return f"postgresql://postgres@{self.name}:{PG_PORT}/{base.DATABASE}"


@dataclass
class DockerState:
    sandbox_id: str
    image: str
    network: str
    hosts: list[DockerHost] = field(default_factory=list)
    password_env: str | None = None
    engine: str = "docker"

    @classmethod
    def read(cls, directory: Path) -> DockerState | None:
        raw = base.read_state(directory / STATE_FILE)
        if raw is None:
            return None
        raw["hosts"] = [DockerHost(**h) for h in raw.get("hosts", [])]
        return cls(**raw)

    def write(self, directory: Path) -> None:
        base.write_state(directory / STATE_FILE, self)

    def standby_of(self, name: str) -> None:
        """The Docker engine runs no standbys (``sandbox up --standby`` is the embedded engine's)."""
        return


def docker_client() -> Any:
    """The Docker SDK client testcontainers uses (raises OperationFailed when no engine answers)."""
    try:
        from testcontainers.core.config import testcontainers_config
        from testcontainers.core.docker_client import DockerClient
    except ImportError:
        raise OperationFailed(
            "--engine docker needs the docker extra: pip install 'shardctl[docker]'"
        ) from None
    testcontainers_config.ryuk_disabled = True
    try:
        client = DockerClient().client
        client.ping()
    except Exception as exc:  # noqa: BLE001 - the docker SDK raises many types for "no engine"
        raise OperationFailed(
            f"--engine docker: no Docker engine is reachable "
            f"({mask(str(exc)).splitlines()[0][:200]})"
        ) from None
    return client


def engine_problem() -> str | None:
    """Why the Docker engine cannot be used here, or None when it answers."""
    try:
        docker_client().close()
    except OperationFailed as exc:
        return str(exc)
    return None


class DockerObjects:
    """One sandbox's objects in the Docker engine, found by their labels: the image it runs, its
    network, and per host a container with its data volume."""

    def __init__(self, directory: Path):
        self.dir = directory
        self._client: Any = None

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = docker_client()
        return self._client

    def labels(self, state: DockerState, host: str | None = None) -> dict[str, str]:
        out = {LABEL: state.sandbox_id, LABEL_DIR: str(self.dir)}
        if host:
            out[LABEL_HOST] = host
        return out

    def _filters(self, state: DockerState | None) -> list[dict]:
        """By the directory label (a lost state file) and by the sandbox's id label."""
        return [{"label": f"{LABEL_DIR}={self.dir}"}] + (
            [{"label": f"{LABEL}={state.sandbox_id}"}] if state else []
        )

    def _labelled(self, kind: str, state: DockerState | None) -> list[Any]:
        """This sandbox's ``kind`` (containers, volumes, networks), each once."""
        seen: dict[str, Any] = {}
        for f in self._filters(state):
            found: Iterable[Any] = (
                self.client.containers.list(all=True, filters=f)
                if kind == "containers"
                else getattr(self.client, kind).list(filters=f)
            )
            for obj in found:
                seen[obj.id] = obj
        return list(seen.values())

    def containers(self, state: DockerState | None) -> list[Any]:
        return self._labelled("containers", state)

    def remove_all(self, state: DockerState | None) -> dict[str, int]:
        """Remove the containers, then the volumes and the network; how many of each."""
        removed = {}
        for kind in ("containers", "volumes", "networks"):
            found = self._labelled(kind, state)
            for obj in found:
                obj.remove(force=True, v=True) if kind == "containers" else obj.remove()
            removed[kind] = len(found)
        return removed

    def container(self, host: DockerHost) -> Any:
        import docker.errors

        try:
            return self.client.containers.get(host.container)
        except docker.errors.NotFound:
            raise OperationFailed(
                f"sandbox host {host.name}: its container {host.container[:12]} is gone "
                f"(removed outside shardctl); start afresh: shardctl sandbox down --destroy "
                f"--dir {self.dir}"
            ) from None

    def running(self, host: DockerHost) -> bool:
        try:
            return self.client.containers.get(host.container).status == "running"
        except Exception:  # noqa: BLE001 - a removed container is not running
            return False

    def require_image(self, image: str) -> None:
        """The image must be present or pullable; a clear error instead of a pull failure midway."""
        client = self.client  # first: without the docker extra, this is the error to give
        import docker.errors

        try:
            client.images.get(image)
            return
        except docker.errors.ImageNotFound:
            pass
        try:
            client.images.pull(image)
        except docker.errors.APIError as exc:
            reason = mask(str(exc)).splitlines()[0][:200]
            raise OperationFailed(
                f"--engine docker: image {image} is not available locally and cannot be pulled "
                f"({reason}); build one and pass --image (see examples/docker/prepare.sh)"
            ) from None

    def network(self, state: DockerState) -> Any:
        from testcontainers.core.network import Network

        net = Network(docker_network_kw={"labels": self.labels(state)})
        net.name = state.network
        found = self.client.networks.list(names=[state.network])
        if found:
            net._network = found[0]
        else:
            net.create()
        return net

    def create(self, state: DockerState, name: str, network: Any) -> DockerHost:
        """A started container (and its volume) for host ``name``, published on 127.0.0.1."""
        from testcontainers.core.container import DockerContainer

        host = DockerHost(name=name, port=free_port(), volume=f"shardctl-{state.sandbox_id}-{name}")
        self.client.volumes.create(name=host.volume, labels=self.labels(state, name))
        env = {"POSTGRES_DB": base.DATABASE, "PGDATA": PGDATA}
        if state.password_env:
            env["POSTGRES_PASSWORD"] = os.environ[state.password_env]
        else:
            env["POSTGRES_HOST_AUTH_METHOD"] = "trust"
        command = ["postgres"] + [
            arg for k, v in CONTAINER_SETTINGS.items() for arg in ("-c", f"{k}={v}")
        ]
        container = (
            DockerContainer(state.image, command=command, env=env)
            .with_name(f"shardctl-{state.sandbox_id}-{name}")
            .with_network(network)
            .with_network_aliases(name)
            .with_volume_mapping(host.volume, VOLUME_PATH, "rw")
            .with_kwargs(labels=self.labels(state, name), hostname=name, shm_size="256m")
        )
        # Published on the loopback interface only (testcontainers' with_bind_ports binds every interface).
        container.ports[f"{PG_PORT}/tcp"] = ("127.0.0.1", host.port)  # type: ignore[assignment]
        try:
            container.start()
        except Exception as exc:  # noqa: BLE001 - docker SDK errors; the message says what went wrong
            raise OperationFailed(
                f"sandbox host {name}: the container did not start: {mask(str(exc)).splitlines()[0][:300]}"
            ) from None
        host.container = container.get_wrapped_container().id
        return host

    def wait_ready(self, host: DockerHost, password_env: str | None, timeout: float) -> str:
        """Wait until the host's server accepts connections; its version (``server_version``)."""
        import psycopg

        def gone() -> bool:
            return self.container(host).status in ("exited", "dead")

        try:
            base.connect_when_ready(host.dsn, password_env, timeout, gone).close()
            # The official image restarts the server once after initialising; ask again a moment later.
            time.sleep(0.5)
            with base.connect_when_ready(host.dsn, password_env, timeout, gone) as conn:
                return conn.execute(SERVER_VERSION).fetchone()[0].split()[0]
        except psycopg.OperationalError as exc:
            logs = (
                self.container(host)
                .logs(tail=5)
                .decode(errors="replace")
                .strip()
                .replace("\n", " | ")
            )
            raise OperationFailed(
                f"sandbox host {host.name} did not accept connections "
                f"({mask(str(exc)).strip().splitlines()[0]}); log: {mask(logs)[-400:]}"
            ) from None


def _host_row(host: DockerHost, running: bool) -> dict:
    return {
        "name": host.name,
        "port": host.port,
        "dsn": host.dsn,
        "peer_dsn": host.peer_dsn,
        "container": host.container[:12],
        "running": running,
    }


class DockerSandbox(base.SandboxBase):
    """A sandbox whose hosts are containers; the directory holds its state and ``shardctl.yaml``."""

    engine = "docker"
    state_class = DockerState
    missing = "no docker sandbox in {dir}"

    def __init__(self, directory: str | os.PathLike):
        super().__init__(directory)
        self.objects = DockerObjects(self.dir)

    @property
    def client(self) -> Any:
        return self.objects.client

    def up(
        self,
        hosts: int | None = None,
        shards: int = base.DEFAULT_SHARDS,
        *,
        image: str | None = None,
        password_env: str | None = None,
        function: str = "plpgsql",
        epoch: str = "2026-01-01T00:00:00Z",
        timeout: float = 120,
    ) -> dict:
        """Start the containers (creating them the first time) and write ``shardctl.yaml``;
        ``hosts``: how many (default 2; an existing sandbox restarts exactly the hosts its topology
        names: ``host_count``)."""
        hosts = self.host_count(hosts)
        base.check_up_args(hosts, shards, password_env)
        if (self.dir / "sandbox.json").exists():
            raise BadInput(
                f"{self.dir} holds an embedded-engine sandbox; use another --dir for --engine docker"
            )
        state = self._state_for(image, password_env)
        network = self.objects.network(state)
        created = []
        for i in range(len(state.hosts), hosts):
            host = self.objects.create(state, f"pg{i + 1}", network)
            state.hosts.append(host)
            state.write(self.dir)
            created.append(host.name)
        for host in state.hosts:
            container = self.objects.container(host)
            if container.status != "running":
                container.start()
        versions = [
            self.objects.wait_ready(host, state.password_env, timeout) for host in state.hosts
        ]
        wrote_topology = self._write_fleet_files(state, shards, function, epoch)
        return {
            "dir": str(self.dir),
            "engine": "docker",
            "image": state.image,
            "version": versions[0],  # the image's PostgreSQL, as its first server reports it
            "topology": str(self.topology_path),
            "created": created,
            "wrote_topology": wrote_topology,
            "hosts": [_host_row(h, True) for h in state.hosts],
            "standbys": [],
        }

    def _state_for(self, image: str | None, password_env: str | None) -> DockerState:
        """The sandbox's state (a new one, written, the first time), once its image is there."""
        state = self.state
        if state is not None and image and image != state.image:
            raise BadInput(
                f"this sandbox runs {state.image}; --image {image} would need a new sandbox "
                f"(sandbox down --destroy first)"
            )
        chosen = state.image if state else (image or DEFAULT_IMAGE)
        self.objects.require_image(chosen)
        self.dir.mkdir(parents=True, exist_ok=True)
        if state is None:
            sid = uuid.uuid4().hex[:12]
            state = DockerState(
                sandbox_id=sid, image=chosen, network=f"shardctl-{sid}", password_env=password_env
            )
            state.write(self.dir)
        return state

    @staticmethod
    def topology_text(state: DockerState, shards: int, function: str, epoch: str) -> str:  # type: ignore[override]
        """The embedded engine's topology, plus each host's ``peer_dsn`` on the container network."""
        text = base.topology_text(state, shards, function, epoch)
        for host in state.hosts:
            line = f'    dsn: "{host.dsn}"\n'
            text = text.replace(line, line + f'    peer_dsn: "{host.peer_dsn}"\n', 1)
        return text.replace(
            "a local fleet for trying shardctl.",
            "a local fleet for trying shardctl (Docker engine; peer_dsn is the container network).",
            1,
        )

    # ---- down, hosts, destroy, status -----------------------------------------------
    def down(self) -> dict:
        """Stop the containers (their volumes keep the data; ``up`` starts them again)."""
        state = self._require_state()
        stopped = []
        for container in self.objects.containers(state):
            if container.status == "running":
                container.stop(timeout=60)
                stopped.append(container.labels.get(LABEL_HOST, container.name))
        return {"dir": str(self.dir), "stopped": sorted(stopped)}

    def _host(self, name: str) -> DockerHost:
        host = next((h for h in self._require_state().hosts if h.name == name), None)
        if host is None:
            raise BadInput(f"no sandbox host {name}")
        return host

    def stop_host(self, name: str, mode: str = "fast") -> None:
        self.objects.container(self._host(name)).stop(timeout=0 if mode == "immediate" else 60)

    def start_host(self, name: str) -> None:
        state = self._require_state()
        host = self._host(name)
        self.objects.container(host).start()
        self.objects.wait_ready(host, state.password_env, 120)

    def destroy(self) -> dict:
        """Remove this sandbox's containers, volumes and network, then its directory."""
        removed = self.objects.remove_all(self.state)
        shutil.rmtree(self.dir, ignore_errors=True)
        return {"dir": str(self.dir), "destroyed": True, "removed": removed}

    def status(self) -> dict:
        state = self._require_state()
        by_id = {c.id: c for c in self.objects.containers(state)}
        hosts = []
        for h in state.hosts:
            c = by_id.get(h.container)
            running = bool(c and c.status == "running")
            pid = (c.attrs.get("State", {}).get("Pid") or None) if running else None
            hosts.append({**_host_row(h, running), "pid": pid})
        return {
            "dir": str(self.dir),
            "engine": "docker",
            "image": state.image,
            "topology": str(self.topology_path),
            "hosts": hosts,
            "standbys": [],
        }

    def running(self, host: DockerHost) -> bool:
        return self.objects.running(host)


def open_sandbox(directory: str | os.PathLike) -> Sandbox:
    """The sandbox in ``directory``, whichever engine made it (a Docker one has ``docker.json``)."""
    if (Path(directory) / STATE_FILE).exists():
        return DockerSandbox(directory)  # type: ignore[return-value]
    return Sandbox(directory)
