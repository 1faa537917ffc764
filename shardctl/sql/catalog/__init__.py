"""Catalog, control-table and replication queries, one module per subject:

* ``control``: the control schema's records (moves, redirects, shard states, ledger reads);
* ``ledger``: the migration and host-level ledgers' writes, the events, the verified-versions cache;
* ``stubs``: a moved shard's stub schema, guard triggers and revoked write privileges;
* ``inspect``: what a host and its schemas hold, and what the server and role allow;
* ``data``: locks, COPY, snapshots and checksums of a shard's rows;
* ``replication``: publications, slots and subscriptions;
* ``verify``: ``verify``'s set-based reads;
* ``capacity``: connection headroom and server cores.

Each function is one or a few statements on one connection; loops that wait or pace belong to the
operation that drives them (``ops/move/transfer.py``). Session and transaction texts are
``sql/session.py``; long fixed queries are ``sql/queries/*.sql``.
"""
