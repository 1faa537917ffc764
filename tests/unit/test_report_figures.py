"""init's figures beside the hosts are typed (InitFigures), and its --json document keeps their keys."""

from __future__ import annotations

from shardctl.engine.fanout import FleetReport, HostLevelFigures, InitFigures


def test_init_figures_are_typed_and_keep_the_documents_keys() -> None:
    figures = InitFigures(
        latest_version=3,
        recreated={"pg1": "0-1"},
        host_level=HostLevelFigures(latest=2, applied={"pg1": [1, 2]}),
    )
    doc = FleetReport("init", [], 0.25, extra=figures).to_dict()
    assert doc["latest_version"] == 3
    assert doc["recreated"] == {"pg1": "0-1"}
    assert doc["host_level"] == {"latest": 2, "applied": {"pg1": [1, 2]}}
    assert list(doc)[:5] == ["command", "ok", "changed", "seconds", "hosts"]
    assert "latest_version" not in FleetReport("migrate", [], 0.1).to_dict()
