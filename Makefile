.PHONY: install generate test test-unit test-fleet test-slow test-docker test-docs test-oldest bench docs docs-serve lint clean

install:
	pip install -e '.[dev]'

test:
	python -m pytest -q

test-unit:
	python -m pytest -q tests/unit

test-fleet:
	python -m pytest -q tests/fleet

# The slow tests: the scale tests, and second variants of what the default suite covers
# (docs/testing.md, "The default suite's time"). test_migrate_live.py's hold a rate and stall
# limits: alone, in one process (beside a decode test on the other core, its load generator fell to
# 383 ops/s at load ~25). The others on two workers; worksteal, not loadfile: the three
# 10-million-ID decode tests are in one file, and would otherwise all wait for one worker.
test-slow:
	python -m pytest -q -m slow -n 0 tests/fleet/test_migrate_live.py
	python -m pytest -q -m slow -n 2 --dist worksteal --ignore tests/fleet/test_migrate_live.py

# The docs are tests: every shell and Python block of README.md and docs/*.md runs as written, each
# page in a directory of its own with its sandboxes stopped after it (tests/docs/; marker docs).
# Two workers: the pages are independent, and most of a page's time is waiting for its servers.
test-docs:
	python -m pytest -q -m docs -n 2 --dist load tests/docs

# Docker tests: installs docker.io + debootstrap if missing, starts dockerd (unless an engine answers),
# builds local/debian:bookworm and local/shardctl-postgres:18, runs the tests marked docker, then
# stops the dockerd it started. Needs root on Debian and the docker extra (pip install -e '.[docker]');
# see examples/docker/prepare.sh. SHARDCTL_DOCKER_REQUIRED=1: a docker test that cannot run fails
# instead of skipping. .ci/run runs test-slow and test-docker after the default suite.
test-docker:
	@examples/docker/prepare.sh || { examples/docker/stop-dockerd.sh; exit 1; }; \
	SHARDCTL_DOCKER_REQUIRED=1 python -m pytest -q -m docker -n 0; rc=$$?; examples/docker/stop-dockerd.sh; exit $$rc

# The ORM integrations on the oldest versions pyproject claims (Django 4.2, SQLAlchemy 2.0.0 for the
# sync sessions, 2.0.16 for the asyncio ones), in a venv of their own (.venv-oldest). pip warns that
# the pins fall below the dev extra's; that is the point. Their slow variants too (-m 'not docs'
# replaces the default 'not slow'): on the oldest versions nothing else runs them.
test-oldest:
	python -m venv .venv-oldest
	.venv-oldest/bin/pip install -q -e '.[dev]'
	.venv-oldest/bin/pip install -q 'django==4.2.*' 'sqlalchemy==2.0.0' 2>/dev/null
	.venv-oldest/bin/python -m pytest -q -m 'not docs' tests/fleet/test_django.py tests/fleet/test_sqlalchemy.py
	.venv-oldest/bin/pip install -q 'sqlalchemy[asyncio]==2.0.16' 2>/dev/null
	.venv-oldest/bin/python -m pytest -q -m 'not docs' tests/fleet/test_sqlalchemy_async.py

# The documentation site (mkdocs.yml, docs/) into site/; --strict fails on broken links and anchors.
docs:
	mkdocs build --strict

docs-serve:
	mkdocs serve

bench:
	python bench/next_id.py && python bench/decode.py && python bench/startup.py

# ruff check and ruff format (pinned in the dev extra); .ci/run runs the same two commands.
lint:
	ruff check .
	ruff format --check .

clean:
	rm -rf .venv build dist site .pytest_cache .hypothesis *.egg-info

# The thread Router (shardctl/router/_sync.py) from its one source, the asyncio Router (_async.py);
# tests/unit/test_generated.py fails when the checked-in file is not what this writes.
generate:
	python tests/support/async_to_sync.py
