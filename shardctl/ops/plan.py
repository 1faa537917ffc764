"""``plan``: what ``migrate`` and ``redeploy`` would do, per host, read-only."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..engine import connections as db
from ..engine.executor import RunOptions
from ..engine.fanout import raise_for_status, raise_unreachable
from ..errors import BadInput
from ..model.ranges import format_shards
from ..model.topology import Topology
from .migrate import MigrateResult, migrate
from .redeploy import redeploy


@dataclass
class TemplatePlan:
    """Per host, the template functions a ``redeploy`` would replace (object → shards), or why the
    templates cannot be redeployed at all (``refused``: a layout or epoch change)."""

    stale: dict[str, dict[str, str]] = field(default_factory=dict)
    refused: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"refused": self.refused} if self.refused is not None else {"stale": self.stale}

    def lines(self) -> list[str]:
        """One line per finding, as ``plan`` prints them."""
        if self.refused is not None:
            return [f"templates: {self.refused}"]
        return [
            f"{host}: template {o} differs on shards {s} (run shardctl redeploy)"
            for host, objects in self.stale.items()
            for o, s in objects.items()
        ]


def template_plan(
    topo: Topology,
    hosts: list[str] | None = None,
    connect_timeout: int = db.DEFAULT_CONNECT_TIMEOUT,
) -> TemplatePlan:
    """The template functions a ``redeploy`` would replace on each reachable host (read-only)."""
    try:
        report = redeploy(topo, hosts=hosts, dry_run=True, connect_timeout=connect_timeout)
    except BadInput as exc:
        return TemplatePlan(refused=str(exc))
    return TemplatePlan(
        stale={
            h.host: {o: format_shards(s) for o, s in h.value.stale.items()}
            for h in report.hosts
            if h.reachable
        }
    )


@dataclass
class PlanResult:
    """The result of :func:`plan`: the pending migrations (``migrate``'s check report) and the stale
    template functions. Pending work is what a plan shows, not an error: :meth:`raise_for_status`
    raises for unreachable hosts (exit 3), the fleet's health findings (exit 4: shards missing, failed
    or lagging behind the others, as ``status`` says) and host errors (exit 1)."""

    migrations: MigrateResult
    templates: TemplatePlan

    @property
    def hosts(self):
        return self.migrations.hosts

    @property
    def ok(self) -> bool:
        """Every host answered without error and the fleet is healthy (pending work does not count)."""
        health = self.migrations.health
        healthy = health is None or health.ok
        return healthy and all(h.reachable and not h.error for h in self.migrations.hosts)

    @property
    def pending_total(self) -> int:
        return self.migrations.pending_total

    def to_dict(self) -> dict[str, Any]:
        doc = {"command": "plan", "ok": self.ok, **self.migrations.plan_dict()}
        doc["templates"] = self.templates.to_dict()
        if self.migrations.health is not None:
            doc["health"] = self.migrations.health.to_dict()
        return doc

    def raise_for_status(self) -> PlanResult:
        doc = self.to_dict()
        raise_unreachable(self.migrations.hosts, doc)
        if self.migrations.health is not None:
            self.migrations.health.raise_for("plan", doc)
        raise_for_status("plan", self.migrations.hosts, report=doc)
        return self


def plan(
    topo: Topology,
    *,
    hosts: list[str] | None = None,
    target: int | None = None,
    connect_timeout: int = db.DEFAULT_CONNECT_TIMEOUT,
) -> PlanResult:
    """Per host: the shards at each migration version, what is pending up to ``target`` (default: the
    latest), drift, gaps and orphans, and the template functions a ``redeploy`` would replace.
    Touches nothing."""
    report = migrate(
        topo,
        hosts=hosts,
        check=True,
        target=target,
        options=RunOptions(connect_timeout=connect_timeout),
    )
    return PlanResult(report, template_plan(topo, hosts, connect_timeout))
