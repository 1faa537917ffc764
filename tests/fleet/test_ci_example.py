"""examples/ci/shardctl-migrate.yml: run the workflow's own shardctl commands against sandbox servers.

The test reads the workflow, decides which jobs a pull request and a push to main would run (from
their ``if:`` conditions), and runs the ``shardctl`` lines of their ``run:`` steps in order, the way
the runner would: a failing step ends the job, except for ``if: always()`` steps. So the workflow
cannot drift from the CLI without this test failing.
"""

from __future__ import annotations

import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from support.fleet import connect, load, run_cli

WORKFLOW = Path(__file__).resolve().parents[2] / "examples" / "ci" / "shardctl-migrate.yml"
ADD_LOCATION = "ALTER TABLE {{ schema|ident }}.photos ADD COLUMN location text;\n"
CAPTION_INDEX = "CREATE INDEX photos_caption_idx ON {{ schema|ident }}.photos (caption);\n"
BASE = "base/migrations"  # where the workflow checks out the base branch's migrations


@dataclass
class StepRun:
    job: str
    step: str
    args: list[str]
    exit_code: int
    stdout: str
    stderr: str


def workflow() -> dict:
    doc = yaml.safe_load(WORKFLOW.read_text())
    doc["on"] = doc.pop(True, doc.get("on"))  # YAML 1.1 reads a bare `on:` key as True
    return doc


def condition_holds(expr: str | None, event: str, ref: str) -> bool:
    """Evaluate the small subset of GitHub expressions the workflow uses."""
    if expr is None:
        return True
    text = expr.strip()
    if text.startswith("${{") and text.endswith("}}"):
        text = text[3:-2]
    if text.strip() == "always()":
        return True
    text = text.replace("github.event_name", repr(event)).replace("github.ref", repr(ref))
    text = (
        text.replace("&&", " and ")
        .replace("||", " or ")
        .replace("!", " not ")
        .replace(" not =", " !=")
    )
    assert re.fullmatch(r"[\w\s'/.=!()-]*", text), (
        f"unsupported expression in the workflow: {expr!r}"
    )
    return bool(eval(text, {"__builtins__": {}}, {}))


def commands(run: str) -> list[list[str]]:
    """The shardctl command lines of a ``run:`` script (other lines must be the install step)."""
    out = []
    for line in run.replace("\\\n", " ").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("shardctl "):
            assert "${{" not in line and "$" not in line, (
                f"a shardctl line the test cannot run: {line!r}"
            )
            args = shlex.split(line)[1:]
            assert "--config" not in args and "-c" not in args, (
                "use SHARDCTL_CONFIG, as the workflow's env does"
            )
            out.append(args)
        else:
            assert line.startswith("pip install "), f"unexpected command in the workflow: {line!r}"
    return out


def run_event(event: str, ref: str, env: dict[str, str]) -> list[StepRun]:
    """Run the shardctl steps of every job ``event`` on ``ref`` triggers, as the runner would."""
    wf = workflow()
    runs: list[StepRun] = []
    for job_name, job in wf["jobs"].items():
        if not condition_holds(job.get("if"), event, ref):
            continue
        failed = False
        for step in job["steps"]:
            if "run" not in step:
                continue
            cond = step.get("if")
            if failed and (cond is None or "always()" not in cond):
                continue
            if cond is not None and not condition_holds(cond, event, ref):
                continue
            for args in commands(step["run"]):
                result = run_cli(*args, env=env)
                runs.append(
                    StepRun(
                        job_name,
                        step.get("name", ""),
                        args,
                        result.exit_code,
                        result.stdout,
                        result.stderr,
                    )
                )
                if result.exit_code != 0:
                    failed = True
                    break
    return runs


@pytest.fixture
def ci_env(make_fleet, monkeypatch):
    """A sandbox fleet where the workflow expects it: shardctl.yaml in the working directory."""
    fleet = make_fleet(hosts=2, shards=64)
    assert fleet.name == "shardctl.yaml"
    monkeypatch.chdir(fleet.parent)
    env = {k: str(v) for k, v in workflow().get("env", {}).items() if "${{" not in str(v)}
    assert env == {"SHARDCTL_CONFIG": "shardctl.yaml"}
    assert run_cli("init", env=env).exit_code == 0
    return fleet, env


def test_workflow_triggers_on_pull_requests_and_main():
    wf = workflow()
    assert "pull_request" in wf["on"]
    assert wf["on"]["push"]["branches"] == ["main"]
    pr = [
        n
        for n, j in wf["jobs"].items()
        if condition_holds(j.get("if"), "pull_request", "refs/pull/7/merge")
    ]
    main = [
        n for n, j in wf["jobs"].items() if condition_holds(j.get("if"), "push", "refs/heads/main")
    ]
    branch = [
        n
        for n, j in wf["jobs"].items()
        if condition_holds(j.get("if"), "push", "refs/heads/feature")
    ]
    pr_cmds = [
        a for n in pr for s in wf["jobs"][n]["steps"] if "run" in s for a in commands(s["run"])
    ]
    main_cmds = [
        a for n in main for s in wf["jobs"][n]["steps"] if "run" in s for a in commands(s["run"])
    ]
    assert pr_cmds[:2] == [["migrate", "--check", "--base", BASE], ["lint", "--base", BASE]], (
        "the pull-request job starts with the two gates"
    )
    base_checkout = [
        s for n in pr for s in wf["jobs"][n]["steps"] if s.get("with", {}).get("path") == "base"
    ]
    assert base_checkout and base_checkout[0]["with"]["ref"] == "${{ github.base_ref }}"
    assert not any(a[0] == "migrate" and not {"--check", "--dry-run"} & set(a) for a in pr_cmds), (
        "a pull request must not change the fleet"
    )
    assert any(a[0] == "migrate" and not {"--check", "--dry-run"} & set(a) for a in main_cmds)
    assert branch == []


def checkout_base(fleet: Path) -> None:
    """What the workflow's second checkout step does: the base branch's migrations under base/."""
    base = fleet.parent / BASE
    if base.exists():
        shutil.rmtree(base)
    shutil.copytree(fleet.parent / "migrations", base)


def test_workflow_commands_against_the_sandbox(ci_env):
    fleet, env = ci_env
    topo = load(fleet)
    checkout_base(fleet)  # main at V2, and so is the fleet
    (fleet.parent / "migrations" / "V0003__photo_location.sql").write_text(ADD_LOCATION)

    # A pull request that adds V3: both gates pass (it is new, after the base's head, renders for every
    # shard, and squawk finds nothing), the dry run shows its SQL, and nothing changes.
    runs = run_event("pull_request", "refs/pull/7/merge", env)
    assert [r.args for r in runs] == [
        ["migrate", "--check", "--base", BASE],
        ["lint", "--base", BASE],
        ["migrate", "--dry-run"],
    ], runs
    assert all(r.exit_code == 0 for r in runs), runs
    assert "V0003__photo_location.sql" in runs[0].stdout and "Gate passed" in runs[0].stdout
    assert "ALTER TABLE insta0.photos ADD COLUMN location text;" in runs[2].stdout
    with connect(topo, "pg1") as conn:
        assert (
            conn.execute("SELECT count(*) FROM shardctl.migrations WHERE version = 3").fetchone()[0]
            == 0
        )

    # The merge: main applies it, then proves nothing is left.
    runs = run_event("push", "refs/heads/main", env)
    assert [r.args[0] for r in runs] == ["migrate", "migrate", "status"], runs
    assert all(r.exit_code == 0 for r in runs), runs
    for host in ("pg1", "pg2"):
        with connect(topo, host) as conn:
            assert (
                conn.execute(
                    "SELECT count(*) FROM shardctl.migrations WHERE version = 3"
                ).fetchone()[0]
                == 32
            )

    # The next pull request (its base is main, now at V3) without migrations is green.
    checkout_base(fleet)
    runs = run_event("pull_request", "refs/pull/8/merge", env)
    assert len(runs) == 3 and all(r.exit_code == 0 for r in runs), runs

    # A pull request that edits an applied migration fails at once, naming it.
    path = fleet.parent / "migrations" / "V0002__create_likes.sql"
    path.write_text(path.read_text() + "-- tidied up\n")
    runs = run_event("pull_request", "refs/pull/9/merge", env)
    assert len(runs) == 1 and runs[0].exit_code == 1, runs
    assert "V0002__create_likes.sql changed after it was applied" in runs[0].stderr


def test_pr_job_passes_a_new_migration_and_fails_the_three_bad_ones(ci_env):
    """Issue 13's acceptance: the PR job passes on a PR that adds a valid migration, and fails on one that
    edits an applied migration, on one squawk rejects, and on a `.SQL` file."""
    fleet, env = ci_env
    migrations = fleet.parent / "migrations"
    checkout_base(fleet)
    likes = migrations / "V0002__create_likes.sql"
    original = likes.read_text()

    def pull_request(number: int) -> list[StepRun]:
        return run_event("pull_request", f"refs/pull/{number}/merge", env)

    # 1. a valid new migration: every step of the job passes.
    (migrations / "V0003__photo_location.sql").write_text(ADD_LOCATION)
    runs = pull_request(10)
    assert len(runs) == 3 and all(r.exit_code == 0 for r in runs), runs
    (migrations / "V0003__photo_location.sql").unlink()

    # 2. an edited applied migration: the gate fails, naming the file.
    likes.write_text(original.replace("UNIQUE (photo_id, user_id)", "UNIQUE (user_id, photo_id)"))
    runs = pull_request(11)
    assert [(r.args[0], r.exit_code) for r in runs] == [("migrate", 1)], runs
    assert "V0002__create_likes.sql changed after it was applied" in runs[0].stderr
    likes.write_text(original)

    # 3. a migration squawk rejects (a plain CREATE INDEX blocks writes to an existing table): the gate
    # passes, lint fails naming the file, its line and the rule.
    (migrations / "V0003__caption_index.sql").write_text(CAPTION_INDEX)
    runs = pull_request(12)
    assert [(r.args[0], r.exit_code) for r in runs] == [("migrate", 0), ("lint", 1)], runs
    assert "V0003__caption_index.sql:1 require-concurrent-index-creation" in runs[1].stderr
    (migrations / "V0003__caption_index.sql").unlink()

    # 4. a `.SQL` file, which discovery used to ignore: refused by name, the job fails at once.
    (migrations / "V0003__photo_location.SQL").write_text(ADD_LOCATION)
    runs = pull_request(13)
    assert len(runs) == 1 and runs[0].exit_code != 0, runs
    assert (
        "V0003__photo_location.SQL is not named V<version>__<description>.sql: the extension must be "
        "lowercase .sql" in runs[0].stderr
    )
    (migrations / "V0003__photo_location.SQL").unlink()

    # Back to the base's files: green again, and none of the four touched the fleet.
    assert all(r.exit_code == 0 for r in pull_request(14))
    topo = load(fleet)
    for host in ("pg1", "pg2"):
        with connect(topo, host) as conn:
            assert conn.execute("SELECT max(version) FROM shardctl.migrations").fetchone()[0] == 2
