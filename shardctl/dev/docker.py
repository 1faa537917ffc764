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

import json
import os
import shutil
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import BadInput, OperationFailed
from ..model.dsn import mask
from ..sql.render import builtin_dir
from ..sql.session import PING
from .sandbox import DATABASE, DEFAULT_SHARDS, SERVER_SETTINGS, Sandbox, _free_port

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
        return f"postgresql://postgres@127.0.0.1:{self.port}/{DATABASE}"

    @property
    def peer_dsn(self) -> str:
        return f"postgresql://postgres@{self.name}:{PG_PORT}/{DATABASE}"


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
        path = directory / STATE_FILE
        if not path.exists():
            return None
        raw = json.loads(path.read_text())
        raw["hosts"] = [DockerHost(**h) for h in raw.get("hosts", [])]
        return cls(**raw)

    def write(self, directory: Path) -> None:
        (directory / STATE_FILE).write_text(json.dumps(asdict(self), indent=2) + "\n")

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


class DockerSandbox:
    """A sandbox whose hosts are containers; the directory holds its state and ``shardctl.yaml``."""

    engine = "docker"

    def __init__(self, directory: str | os.PathLike):
        self.dir = Path(directory).resolve()
        self._client: Any = None

    @property
    def topology_path(self) -> Path:
        return self.dir / "shardctl.yaml"

    @property
    def state(self) -> DockerState | None:
        return DockerState.read(self.dir)

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

    # ---- up ----------------------------------------------------------------------
    def up(
        self,
        hosts: int = 2,
        shards: int = DEFAULT_SHARDS,
        *,
        image: str | None = None,
        password_env: str | None = None,
        function: str = "plpgsql",
        epoch: str = "2026-01-01T00:00:00Z",
        timeout: float = 120,
    ) -> dict:
        """Start the containers (creating them the first time) and write ``shardctl.yaml``."""
        if hosts < 1 or hosts > 64:
            raise BadInput(f"--hosts must be between 1 and 64, got {hosts}")
        if shards < hosts or shards > 8192:
            raise BadInput(f"--shards must be between --hosts ({hosts}) and 8192, got {shards}")
        if password_env and not os.environ.get(password_env):
            raise BadInput(f"--password-env {password_env}: that environment variable is not set")
        if (self.dir / "sandbox.json").exists():
            raise BadInput(
                f"{self.dir} holds an embedded-engine sandbox; use another --dir for --engine docker"
            )
        state = self.state
        if state is not None and image and image != state.image:
            raise BadInput(
                f"this sandbox runs {state.image}; --image {image} would need a new sandbox "
                f"(sandbox down --destroy first)"
            )
        chosen = state.image if state else (image or DEFAULT_IMAGE)
        self._require_image(chosen)
        self.dir.mkdir(parents=True, exist_ok=True)
        if state is None:
            sid = uuid.uuid4().hex[:12]
            state = DockerState(
                sandbox_id=sid, image=chosen, network=f"shardctl-{sid}", password_env=password_env
            )
            state.write(self.dir)
        hosts = max(hosts, len(state.hosts))
        network = self._network(state)
        created = []
        for i in range(len(state.hosts), hosts):
            host = self._create(state, f"pg{i + 1}", network)
            state.hosts.append(host)
            state.write(self.dir)
            created.append(host.name)
        for host in state.hosts:
            container = self._container(host)
            if container.status != "running":
                container.start()
        for host in state.hosts:
            self._wait_ready(host, state.password_env, timeout)
        wrote_topology = False
        if not self.topology_path.exists():
            self.topology_path.write_text(self.topology_text(state, shards, function, epoch))
            wrote_topology = True
        migrations = self.dir / "migrations"
        if not migrations.exists():
            shutil.copytree(builtin_dir("migrations"), migrations)
        return {
            "dir": str(self.dir),
            "engine": "docker",
            "image": state.image,
            "topology": str(self.topology_path),
            "created": created,
            "wrote_topology": wrote_topology,
            "hosts": [
                {
                    "name": h.name,
                    "port": h.port,
                    "dsn": h.dsn,
                    "peer_dsn": h.peer_dsn,
                    "container": h.container[:12],
                    "running": True,
                }
                for h in state.hosts
            ],
            "standbys": [],
        }

    def _container(self, host: DockerHost) -> Any:
        import docker.errors

        try:
            return self.client.containers.get(host.container)
        except docker.errors.NotFound:
            raise OperationFailed(
                f"sandbox host {host.name}: its container {host.container[:12]} is gone "
                f"(removed outside shardctl); start afresh: shardctl sandbox down --destroy "
                f"--dir {self.dir}"
            ) from None

    def _require_image(self, image: str) -> None:
        """The image must be present or pullable; a clear error instead of a pull failure midway."""
        import docker.errors

        try:
            self.client.images.get(image)
            return
        except docker.errors.ImageNotFound:
            pass
        try:
            self.client.images.pull(image)
        except docker.errors.APIError as exc:
            raise OperationFailed(
                f"--engine docker: image {image} is not available locally and cannot be pulled "
                f"({mask(str(exc)).splitlines()[0][:200]}); build one and pass --image "
                f"(see examples/docker/prepare.sh)"
            ) from None

    def _network(self, state: DockerState) -> Any:
        from testcontainers.core.network import Network

        net = Network(docker_network_kw={"labels": self.labels(state)})
        net.name = state.network
        found = self.client.networks.list(names=[state.network])
        if found:
            net._network = found[0]
        else:
            net.create()
        return net

    def _create(self, state: DockerState, name: str, network: Any) -> DockerHost:
        from testcontainers.core.container import DockerContainer

        host = DockerHost(
            name=name, port=_free_port(), volume=f"shardctl-{state.sandbox_id}-{name}"
        )
        self.client.volumes.create(name=host.volume, labels=self.labels(state, name))
        env = {"POSTGRES_DB": DATABASE, "PGDATA": PGDATA}
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
                f"sandbox host {name}: the container did not start: "
                f"{mask(str(exc)).splitlines()[0][:300]}"
            ) from None
        host.container = container.get_wrapped_container().id
        return host

    def _wait_ready(self, host: DockerHost, password_env: str | None, timeout: float) -> None:
        import psycopg

        kwargs = {"password": os.environ.get(password_env)} if password_env else {}
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(
                    host.dsn, connect_timeout=5, autocommit=True, **kwargs
                ) as conn:
                    conn.execute(PING)
                # The official image restarts the server once after initialising; ask again a moment later.
                time.sleep(0.5)
                with psycopg.connect(
                    host.dsn, connect_timeout=5, autocommit=True, **kwargs
                ) as conn:
                    conn.execute(PING)
                return
            except psycopg.OperationalError as exc:
                container = self._container(host)
                if container.status in ("exited", "dead") or time.monotonic() > deadline:
                    logs = (
                        container.logs(tail=5).decode(errors="replace").strip().replace("\n", " | ")
                    )
                    raise OperationFailed(
                        f"sandbox host {host.name} did not accept connections "
                        f"({mask(str(exc)).strip().splitlines()[0]}); log: {mask(logs)[-400:]}"
                    ) from None
                time.sleep(0.5)

    @staticmethod
    def topology_text(state: DockerState, shards: int, function: str, epoch: str) -> str:
        """The embedded engine's topology, plus each host's ``peer_dsn`` on the container network."""
        text = Sandbox.topology_text(state, shards, function, epoch)  # type: ignore[arg-type]
        for host in state.hosts:
            line = f'    dsn: "{host.dsn}"\n'
            text = text.replace(line, line + f'    peer_dsn: "{host.peer_dsn}"\n', 1)
        return text.replace(
            "a local fleet for trying shardctl.",
            "a local fleet for trying shardctl (Docker engine; peer_dsn is the container network).",
            1,
        )

    # ---- down, destroy, status -----------------------------------------------------
    def _require_state(self) -> DockerState:
        state = self.state
        if state is None:
            raise BadInput(f"no docker sandbox in {self.dir}")
        return state

    def _containers(self, state: DockerState | None) -> list[Any]:
        """This sandbox's containers: by its id label, and by its directory label (a lost state file)."""
        seen: dict[str, Any] = {}
        filters = [{"label": f"{LABEL_DIR}={self.dir}"}]
        if state:
            filters.append({"label": f"{LABEL}={state.sandbox_id}"})
        for f in filters:
            for c in self.client.containers.list(all=True, filters=f):
                seen[c.id] = c
        return list(seen.values())

    def down(self) -> dict:
        """Stop the containers (their volumes keep the data; ``up`` starts them again)."""
        state = self._require_state()
        stopped = []
        for container in self._containers(state):
            if container.status == "running":
                container.stop(timeout=60)
                stopped.append(container.labels.get(LABEL_HOST, container.name))
        return {"dir": str(self.dir), "stopped": sorted(stopped)}

    def stop_host(self, name: str, mode: str = "fast") -> None:
        host = self._host(name)
        self._container(host).stop(timeout=0 if mode == "immediate" else 60)

    def start_host(self, name: str) -> None:
        state = self._require_state()
        host = self._host(name)
        self._container(host).start()
        self._wait_ready(host, state.password_env, 120)

    def _host(self, name: str) -> DockerHost:
        host = next((h for h in self._require_state().hosts if h.name == name), None)
        if host is None:
            raise BadInput(f"no sandbox host {name}")
        return host

    def destroy(self) -> dict:
        """Remove this sandbox's containers, volumes and network, then its directory."""
        state = self.state
        removed = {"containers": 0, "volumes": 0, "networks": 0}
        for container in self._containers(state):
            container.remove(force=True, v=True)
            removed["containers"] += 1
        filters = [{"label": f"{LABEL_DIR}={self.dir}"}] + (
            [{"label": f"{LABEL}={state.sandbox_id}"}] if state else []
        )
        for kind in ("volumes", "networks"):
            seen: dict[str, Any] = {}
            for f in filters:
                for obj in getattr(self.client, kind).list(filters=f):
                    seen[obj.id] = obj
            for obj in seen.values():
                obj.remove()
                removed[kind] += 1
        shutil.rmtree(self.dir, ignore_errors=True)
        return {"dir": str(self.dir), "destroyed": True, "removed": removed}

    def status(self) -> dict:
        state = self._require_state()
        by_id = {c.id: c for c in self._containers(state)}
        hosts = []
        for h in state.hosts:
            c = by_id.get(h.container)
            running = bool(c and c.status == "running")
            hosts.append(
                {
                    "name": h.name,
                    "port": h.port,
                    "dsn": h.dsn,
                    "peer_dsn": h.peer_dsn,
                    "container": h.container[:12],
                    "running": running,
                    "pid": (c.attrs.get("State", {}).get("Pid") or None) if running else None,
                }
            )
        return {
            "dir": str(self.dir),
            "engine": "docker",
            "image": state.image,
            "topology": str(self.topology_path),
            "hosts": hosts,
            "standbys": [],
        }

    def running(self, host: DockerHost) -> bool:
        try:
            return self.client.containers.get(host.container).status == "running"
        except Exception:  # noqa: BLE001 - a removed container is not running
            return False


def open_sandbox(directory: str | os.PathLike) -> Sandbox:
    """The sandbox in ``directory``, whichever engine made it (a Docker one has ``docker.json``)."""
    if (Path(directory) / STATE_FILE).exists():
        return DockerSandbox(directory)  # type: ignore[return-value]
    return Sandbox(directory)
