"""``ENGINE: "shardctl.django.backend"``: Django's postgresql backend (psycopg 3) whose statements run
on the current shard (:func:`shardctl.django.on_shard`) without leaving anything in the server session.

Every transaction that runs on a shard starts with ``SET LOCAL search_path = <shard>, public`` sent
in the same text as its first statement (psycopg's client-side binding, the simple protocol: one
round trip). In autocommit (outside ``transaction.atomic``) a statement becomes ``<settings>;
<statement>``: one simple-protocol query, which PostgreSQL runs as one implicit transaction, so the
setting ends with it (an error leaves nothing open either); in a transaction the settings go in front of
its first statement, and again when the block switches shards on the same host or a savepoint is
rolled back (which undoes the settings sent since). A transaction pooler may thus give every
transaction another server connection: each runs on its own shard and none sees another's
``search_path``. Nothing is prepared, the time zone is not set on the
session (psycopg converts timestamps on the client), and server-side cursors are off.
"""

from __future__ import annotations

import functools
from typing import Any

import psycopg
from django.core.exceptions import ImproperlyConfigured
from django.db.backends.postgresql import base as postgresql

from ...sql.session import BEGIN_SCRIPT, set_local_search_path
from ..context import _current

IDLE = psycopg.pq.TransactionStatus.IDLE
NO_SHARD = ""  # the search_path outside shards
# Where a transaction is put: (schema, the shard whose redirect it looks for first, or None).
Place = tuple[str, int | None]
NO_PLACE: Place = (NO_SHARD, None)
UNKNOWN = None  # the transaction's search_path is not known here: the next statement sets it


@functools.lru_cache(maxsize=8192)
def settings_sql(schema: str, escape: bool, checked: int | None = None) -> str:
    """The statement that puts a transaction on ``schema`` (``NO_SHARD``: the default path). ``SET LOCAL``
    (a utility statement: about half the server time of ``SELECT set_config(..., true)``), which lasts
    until the end of the transaction, explicit or the implicit one of a multi-statement query; with
    ``checked`` (``Target.checked``), a ``set_config`` that looks for that shard's redirect first."""
    text = set_local_search_path(schema, checked)
    return text.replace("%", "%%") if escape else text


class ShardCursor(postgresql.Cursor):
    """Django's client-binding cursor, putting each transaction on the current shard."""

    def _needs(self, conn: Any) -> tuple[Place | None, bool]:
        """(the place to put the transaction on, or None; whether the statement is a transaction of
        its own), on this cursor's connection ``conn``."""
        target = _current.get()  # current(), without a call: every statement comes here
        place = (
            (target.schema, target.checked)
            if target is not None and target.alias == conn.shardctl_alias
            else NO_PLACE
        )
        if conn.pgconn.transaction_status == IDLE:
            conn.shardctl_place = NO_PLACE
            if not place[0]:
                return None, False
            return place, conn.autocommit
        return (None if place == conn.shardctl_place else place), False

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        conn = self.connection
        place, alone = self._needs(conn)
        if place is None:
            return super().execute(query, params, **kwargs)
        if not isinstance(query, str):  # a Composable: the settings in a round trip of their own
            self._settings(place, alone)
            try:
                return super().execute(query, params, **kwargs)
            finally:
                self._end(alone)
        if params is not None:
            # Bound here, so psycopg's cache of parsed query texts (128 of them) keeps one entry per
            # query, not one per query and shard; the text sent is what binding it with the
            # settings in front would give.
            query, params = self.mogrify(query, params), None
        # Alone (autocommit): the two statements are one implicit transaction, ending with the query.
        super().execute(f"{settings_sql(place[0], False, place[1])}; {query}", params, **kwargs)
        self.nextset()
        if not alone:
            conn.shardctl_place = place
        return self

    def executemany(self, query: Any, params_seq: Any, **kwargs: Any) -> Any:
        place, alone = self._needs(self.connection)
        if place is None:
            return super().executemany(query, params_seq, **kwargs)
        self._settings(place, alone)
        try:
            return super().executemany(query, params_seq, **kwargs)
        finally:
            self._end(alone)

    def _settings(self, place: Place, alone: bool) -> None:
        conn = self.connection
        psycopg.ClientCursor(conn).execute(
            (BEGIN_SCRIPT if alone else "") + settings_sql(place[0], False, place[1])
        )
        conn.shardctl_place = place

    def _end(self, alone: bool) -> None:
        if alone:  # commit what succeeded; a failure left the transaction aborted: roll back
            conn = self.connection
            if conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.INTRANS:
                conn.commit()
            else:
                _quietly(conn.rollback)


def _quietly(fn: Any) -> None:
    try:
        fn()
    except Exception:  # noqa: BLE001, S110 - the connection is broken: Django discards it
        pass


class DatabaseWrapper(postgresql.DatabaseWrapper):
    """postgresql's DatabaseWrapper with :class:`ShardCursor` and no session state."""

    def get_connection_params(self) -> dict:
        if self.settings_dict["OPTIONS"].get("server_side_binding") or self.settings_dict[
            "OPTIONS"
        ].get("pool"):
            raise ImproperlyConfigured(
                "shardctl.django.backend binds parameters on the client and keeps no pool "
                "of its own: remove OPTIONS server_side_binding and pool"
            )
        params = super().get_connection_params()
        params["cursor_factory"] = ShardCursor
        return params

    def get_new_connection(self, conn_params: dict) -> Any:
        conn = super().get_new_connection(conn_params)
        conn.shardctl_alias = self.alias
        conn.shardctl_place = NO_PLACE
        return conn

    def _savepoint_rollback(self, sid: str) -> None:
        """``ROLLBACK TO SAVEPOINT`` also undoes the ``SET LOCAL search_path`` sent since the
        savepoint: the server may be back on another shard than the last one set here, so the next
        statement sends its shard again."""
        super()._savepoint_rollback(sid)
        self.connection.shardctl_place = UNKNOWN

    def ensure_timezone(self) -> bool:
        return (
            False  # Django 4.2 sets the session's time zone here: never (see _configure_timezone)
        )

    def _configure_timezone(self, connection: Any) -> bool:
        return False  # no session SET TIME ZONE: psycopg's loaders convert timestamps to settings.TIME_ZONE

    def _configure_role(self, connection: Any) -> bool:
        if self.settings_dict["OPTIONS"].get("assume_role"):
            raise ImproperlyConfigured(
                "OPTIONS assume_role sets a session role, which a transaction pooler "
                "gives to other clients: connect as the role instead"
            )
        return False
