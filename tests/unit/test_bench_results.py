"""Benchmark runs live in bench/results/, one JSON file per run; the docs keep current figures only.

* every file there is a run, and nothing else is: its name is ``<bench>-<YYYY-MM-DD>-<commit>[-N].json``
  and agrees with its ``bench``, ``date`` and ``commit``, and it names the machine and the figures;
* every bench script records its run through the one helper (bench/results.py);
* the pages that give figures name their runs by file, and no commit hash outside those names (a
  page that says "at 1a2b3c4" is a run log, which belongs in bench/results/).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
NAME = re.compile(
    r"^(?P<bench>[a-z_]+)-(?P<date>\d{4}-\d{2}-\d{2})-(?P<commit>[0-9a-f]{7,12})(-\d+)?$"
)
PAGES = [
    "docs/performance.md",
    "docs/testing.md",
    "docs/migrations.md",
    "bench/README.md",
    "README.md",
]
RUN_REF = re.compile(r"`([a-z_]+-\d{4}-\d{2}-\d{2}-[0-9a-f]{7,12}(?:-\d+)?)`")
# A word of 7 to 12 hex digits with at least one digit and one letter: a commit hash.
HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,12}\b")
RUN_FILES = sorted(RESULTS.glob("*.json"))


def test_every_file_in_results_is_a_run_file():
    others = sorted(p.name for p in RESULTS.iterdir() if p.suffix != ".json")
    assert not others, (
        f"not run files (bench/results.py writes <bench>-<date>-<commit>.json): {others}"
    )


def test_there_are_runs():
    assert len(RUN_FILES) >= 10


@pytest.mark.parametrize("path", RUN_FILES, ids=lambda p: p.stem)
def test_a_run_file_names_its_bench_date_commit_and_machine(path):
    match = NAME.match(path.stem)
    assert match, f"{path.name}: not <bench>-<YYYY-MM-DD>-<commit>.json"
    doc = json.loads(path.read_text())
    assert doc["bench"] == match["bench"]
    assert doc["date"].startswith(match["date"])
    assert doc["commit"] == match["commit"]
    assert isinstance(doc["figures"], dict) and doc["figures"]
    assert doc["machine"]["nproc"] >= 1
    assert {"model", "memory_gb", "load_average"} <= set(doc["machine"])
    assert doc.get("source") in (None, "transcribed from docs", "transcribed from a text log")


def test_every_bench_script_records_its_run_through_the_one_helper():
    scripts = [
        p
        for p in sorted((ROOT / "bench").glob("*.py"))
        if not p.name.startswith("_") and p.name != "results.py"
    ]
    assert len(scripts) >= 10
    missing = [
        p.name
        for p in scripts
        if "c.save_run(" not in p.read_text() and "results.record(" not in p.read_text()
    ]
    assert not missing, f"bench scripts that do not record their run: {missing}"
    writers = [p.name for p in (ROOT / "bench").glob("*.py") if "def record(" in p.read_text()]
    assert writers == ["results.py"]


@pytest.mark.parametrize("page", PAGES)
def test_a_page_names_its_runs_by_file_and_logs_no_commits(page):
    text = (ROOT / page).read_text()
    for ref in RUN_REF.findall(text):
        assert (RESULTS / f"{ref}.json").exists(), f"{page} names {ref}, not in bench/results/"
    logged = HASH.findall(RUN_REF.sub("", text))
    assert not logged, f"{page} names commits {logged}: a run log belongs in bench/results/"
