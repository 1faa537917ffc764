"""Router against real faults, on servers of the test's own (never the shared session servers):
a stopped host, a silent host (a listener that never answers; a SIGSTOPped server), a restart."""

from __future__ import annotations

import logging
import socket
import statistics
import threading
import time

import pytest
from support.faults import CONNECT_TIMEOUT, PG1_KEY, PG2_KEY, calling, frozen, probed
from support.fleet import load

from shardctl import Router
from shardctl.errors import HostUnreachable


def _queued() -> float:
    """Seconds this thread has spent runnable but waiting for a core (schedstat's run_delay)."""
    try:
        with open("/proc/thread-self/schedstat") as stat:
            return int(stat.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def timed(fn, *args, **kwargs) -> tuple[float, object]:
    """(seconds, result or exception) of one call: its wall time less the time the calling thread
    waited for a core meanwhile, so the bounds are on the Router, not on a loaded machine's
    scheduler (a breaker's fast failure once took 0.62 s of wall time in CI under -n 3)."""
    started, queued = time.monotonic(), _queued()
    try:
        result = fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the caller inspects it
        result = exc
    return time.monotonic() - started - (_queued() - queued), result


def warm(router: Router, key: int, connections: int) -> None:
    """Leave ``connections`` idle connections in the key's pool (all checked out at once, then returned)."""
    barrier = threading.Barrier(connections)

    def hold():
        with router.connection(key) as conn:
            conn.execute("SELECT 1")
            barrier.wait()

    threads = [threading.Thread(target=hold) for _ in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats = router.stats()[router.host_for(key).name]
    assert stats["idle"] == stats["size"] == connections


def test_stopped_host_fails_fast_and_quietly_other_hosts_unaffected(box, capfd, caplog):
    caplog.set_level(logging.INFO, logger="shardctl.router")
    with Router(load(box.topology_path)) as router:
        warm(router, PG1_KEY, 4)
        before = [timed(router.execute, PG2_KEY, "SELECT 1")[0] for _ in range(20)]
        capfd.readouterr()
        box.stop_host("pg1")
        pg1, pg2 = [], []
        for _ in range(30):
            pg1.append(timed(router.execute, PG1_KEY, "SELECT 1"))
            pg2.append(timed(router.execute, PG2_KEY, "SELECT 1"))
            time.sleep(0.05)
        for seconds, result in pg1:
            assert isinstance(result, HostUnreachable) and result.host == "pg1", result
            assert seconds <= 1.0, (seconds, result)
        causes = {str(r) for _, r in pg1}
        assert any("refused" in c for c in causes), causes  # libpq's reason, not a pool timeout
        assert all(isinstance(r, list) for _, r in pg2), pg2
        during = [s for s, _ in pg2]
        assert statistics.median(during) <= max(0.05, 3 * statistics.median(before)), (
            before,
            during,
        )
        out, err = capfd.readouterr()
        assert err == "" and out == ""  # nothing on the application's stderr ...
        assert any(
            r.name == "shardctl.router" and "circuit open" in r.getMessage() for r in caplog.records
        )
        stats = router.stats()["pg1"]
        assert (
            stats["breaker"]["state"] in ("open", "half-open")
            and "refused" in stats["breaker"]["cause"]
        )
        assert stats["replaced_idle"] == 4 and stats["errors"]["connect"] >= 1
        # Back up: within the breaker's back-off (at most 5 s), calls succeed again.
        box.start_host("pg1")
        deadline = time.monotonic() + 6
        while isinstance(timed(router.execute, PG1_KEY, "SELECT 1")[1], HostUnreachable):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert router.stats()["pg1"]["breaker"]["state"] == "closed"


def test_restart_with_8_idle_connections_costs_no_request_an_error(box):
    with Router(load(box.topology_path), max_size=8) as router:
        warm(router, PG1_KEY, 8)
        in_flight: list[object] = []
        sleeper = threading.Thread(
            target=lambda: in_flight.append(timed(router.execute, PG1_KEY, "SELECT pg_sleep(30)"))
        )
        sleeper.start()
        time.sleep(0.5)
        box.stop_host("pg1")
        sleeper.join()
        # The request in flight gets the one error, named as such (not a raw psycopg AdminShutdown).
        _, error = in_flight[0]
        assert isinstance(error, HostUnreachable) and "administrator command" in str(error), error
        box.start_host("pg1")
        errors: list[BaseException] = []

        def requests(n: int) -> None:
            for i in range(n):
                try:
                    assert (
                        router.execute(
                            PG1_KEY, "INSERT INTO users (username) VALUES (%s)", (f"r{i}",)
                        )
                        == 1
                    )
                except BaseException as exc:  # noqa: BLE001 - counted below
                    errors.append(exc)

        threads = [threading.Thread(target=requests, args=(10,)) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        requests(10)
        assert errors == []
        stats = router.stats()["pg1"]
        assert stats["replaced_idle"] == 7 and stats["errors"] == {"connection_lost": 1}
        assert router.execute(PG1_KEY, "SELECT count(*) FROM users") == [(90,)]


def silent_listener() -> tuple[socket.socket, int]:
    """A local TCP port that accepts connections (the kernel's backlog) and never says a word."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    return sock, sock.getsockname()[1]


def test_silent_listener_fails_within_connect_timeout(make_fleet):
    path = make_fleet(hosts=2, shards=64, init=True)
    listener, port = silent_listener()
    try:
        text = path.read_text()
        real = text.split("127.0.0.1:")[1].split("/")[0]
        path.write_text(text.replace(f"127.0.0.1:{real}", f"127.0.0.1:{port}", 1))
        with Router(load(path), connect_timeout=CONNECT_TIMEOUT, timeout=1) as router:
            # pg2's first connection is made before the clock starts: on a loaded machine it can take
            # longer than the breaker's first back-off (0.25 s), and the loop would meet only the probe
            router.execute(PG2_KEY, "SELECT 1")
            results = []
            started = time.monotonic()
            while calling(started, results):
                results.append(timed(router.execute, PG1_KEY, "SELECT 1"))
                assert isinstance(timed(router.execute, PG2_KEY, "SELECT 1")[1], list)
            for seconds, result in results:
                assert isinstance(result, HostUnreachable) and result.host == "pg1", result
                assert seconds <= CONNECT_TIMEOUT + 1, (seconds, result)
            # The loop ran past a probe (a call after the first that waited for the server again).
            assert probed(results), results[:3]
            assert (
                results[0][0] >= CONNECT_TIMEOUT - 0.5
            )  # the first one really waited for the server
            assert "timeout" in str(results[0][1]), results[0]
            # between the first call and the probe, the others failed at once (the breaker)
            fast = [seconds for seconds, _ in results[1:] if seconds < CONNECT_TIMEOUT - 0.5]
            assert fast and max(fast) < 0.5, results
    finally:
        listener.close()


@pytest.mark.parametrize("pool", ["cold", pytest.param("warm", marks=pytest.mark.slow)])
def test_sigstopped_server_fails_within_connect_timeout_plus_bound(box, pool):
    bound = 0.5
    with Router(load(box.topology_path), connect_timeout=CONNECT_TIMEOUT, timeout=bound) as router:
        if pool == "warm":
            warm(router, PG1_KEY, 4)
        router.execute(PG2_KEY, "SELECT 1")
        with frozen(box, "pg1"):
            results, others = [], []
            started = time.monotonic()
            while calling(started, results):
                results.append(timed(router.execute, PG1_KEY, "SELECT 1"))
                others.append(timed(router.execute, PG2_KEY, "SELECT 1"))
            assert all(isinstance(r, list) for _, r in others)
            assert statistics.median(s for s, _ in others) < 0.05, (
                others
            )  # pg2 keeps its usual latency
            for seconds, result in results:
                assert isinstance(result, HostUnreachable) and result.host == "pg1", result
                assert seconds <= CONNECT_TIMEOUT + 1, (seconds, result)
            # The loop ran past a probe (a call after the first that waited for the server again).
            assert probed(results), results[:3]
            first = str(results[0][1])
            assert ("no answer within" in first) if pool == "warm" else ("timeout" in first), first
        # Thawed: the host serves again once the breaker lets a probe through.
        deadline = time.monotonic() + 8
        while not isinstance(timed(router.execute, PG1_KEY, "SELECT 1")[1], list):
            assert time.monotonic() < deadline
            time.sleep(0.1)
