"""The example app (examples/app) passes its own tests through shardctl's pytest plugin.

It runs as its users would run it: ``pytest`` in the app's directory, with its own pytest.ini,
the plugin loaded from the installed package's ``pytest11`` entry point (not from our conftest).
"""

import os
import re
import subprocess
import sys
from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "examples" / "app"


def run_app_tests(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=APP,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_the_example_app_passes_its_tests_on_the_embedded_engine():
    result = run_app_tests()
    tail = (result.stdout + result.stderr)[-3000:]
    assert result.returncode == 0, tail
    passed = re.search(r"(\d+) passed", result.stdout)
    assert passed and int(passed.group(1)) >= 5, tail
    assert "skipped" not in result.stdout and "failed" not in result.stdout, tail


def test_the_plugin_is_registered_as_a_pytest11_entry_point():
    from importlib.metadata import entry_points

    names = {ep.name: ep.value for ep in entry_points(group="pytest11")}
    assert names.get("shardctl") == "shardctl.testing"
    help_text = run_app_tests("--help").stdout
    assert "--shardctl-engine" in help_text and "shardctl_migrations" in help_text
    assert "--shardctl-data-dir" in help_text and "shardctl_data_dir" in help_text


def test_a_bad_engine_setting_is_a_usage_error():
    result = run_app_tests("-o", "shardctl_engine=podman")
    assert result.returncode != 0
    assert (
        "shardctl_engine must be one of embedded, docker, got 'podman'"
        in result.stdout + result.stderr
    )
