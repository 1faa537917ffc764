"""Test support: every helper and shared fixture the tests use (tests never import ``conftest`` or
another test file; tests/unit/test_test_layout.py checks).

- :mod:`support.fleet`: the CLI in-process (``run_cli``), topologies, connections, server dirs.
- :mod:`support.process`: shardctl as a real process.
- :mod:`support.moves`, :mod:`support.migrations`: fleets with rows (``fleet3``), traffic during a
  move, migration helpers.
- :mod:`support.faults`, :mod:`support.standby`, :mod:`support.sessions`, :mod:`support.versions`:
  servers of a test file's own, SIGSTOP, streaming replicas, session-state statements (and the fleets a
  file's session-state tests share), PostgreSQL versions.
- :mod:`support.pooler`: PgBouncer in front of the session servers (``pgbouncer``, ``pooled_fleet``);
  :mod:`support.history` and :mod:`support.clients`: the history consistency checker and its clients.
- :mod:`support.load`, :mod:`support.hostile`: load generators; hostile-input runs, measured.

Imported as ``support.…``: pytest puts ``tests/`` on ``sys.path`` (rootdir conftest, no
``__init__.py`` in ``tests/``). The modules with fixtures are registered by ``pytest_plugins`` in
``tests/conftest.py``.
"""
