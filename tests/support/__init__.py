"""Test support shared by the fleet tests: PgBouncer in front of the session servers
(:mod:`support.pooler`) and the history consistency checker (:mod:`support.history`).

Imported as ``support.…``: pytest puts ``tests/`` on ``sys.path`` (rootdir conftest, no
``__init__.py`` in ``tests/``), the same way tests import ``conftest`` and ``helpers``.
"""
