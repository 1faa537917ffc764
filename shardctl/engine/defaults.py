"""The engine's defaults, which are also the CLI's option defaults.

Kept apart from the modules that use them, which import psycopg: the CLI builds its options from
these, and a command refused for bad input (a topology that does not load) ends before any
database driver is imported."""

DEFAULT_CONNECT_TIMEOUT = 10  # seconds to wait for a host to answer
DEFAULT_BATCH = 64
DEFAULT_RECYCLE = 1024  # shards per connection: a backend caches every schema it touches
# Every time here is in seconds (float), as in every option of the library; the SQL layer turns them
# into PostgreSQL's settings (``sql.session.duration``), the CLI reads ``100ms``/``2s`` into them.
# Migrations under traffic (like GitLab's with_lock_retries): short lock waits, many retries.
DEFAULT_LOCK_WAIT = 0.1  # a shard alone (holding no other shard's locks) waits this long
DEFAULT_LOCK_RETRIES = 30
DEFAULT_RETRY_BUDGET = 6.0  # a blocked shard keeps being retried this long
DEFAULT_MAX_LOCK_HOLD = 0.1  # a batch holds its shards' locks at most this long
REDEPLOY_LOCK_TIMEOUT = 1.0  # redeploy gives up on a shard whose lock is not granted in this time
