"""Monarch's retention (``TelemetryConfig.retention_secs``): a job's hosts keep its message, span and
metric rows only that long; the other tables (actors, meshes, ...) keep theirs."""

import time

import pyarrow as pa

from monarch.actor import Actor, endpoint
from monarch.job import ProcessJob, TelemetryConfig
from monarch_telemetry.recorder import Recorder, hash_id, now_us
from monarch_telemetry.table import RETAINED, Store, Table
from monarch_telemetry.schema import TABLES


def _rows(t: Table) -> list:
    return pa.Table.from_batches(t.batches(), schema=t.schema).column("id").to_pylist()


def test_rows_older_than_the_retention_go_when_read_and_younger_ones_stay():
    t = Table(TABLES["message_status_events_ext"], batch_rows=4)
    now = now_us()
    ages_s = [50, 40, 30, 20, 12, 8, 3, 1, 0]  # the batch of 4 sealed second holds both sides of 10 s
    for i, age in enumerate(ages_s):
        t.append(i, now - age * 1_000_000, 7, "queued", "h")
    assert _rows(t) == list(range(9))
    t.max_age_us = 10_000_000
    assert _rows(t) == [5, 6, 7, 8]
    assert t.num_rows == 4 and t.dropped_rows == 5
    # As Monarch's sweeps: at most once per window (10 s here), so an old row stays until the next one.
    for i in range(9, 13):
        t.append(i, now - 60_000_000, 7, "queued", "h")
    assert _rows(t) == [5, 6, 7, 8, 9, 10, 11, 12]
    t._swept_us -= 10_000_000  # the window has passed
    assert _rows(t) == [5, 6, 7, 8]
    t.max_age_us = 0  # no age bound: what is left stays
    assert _rows(t) == [5, 6, 7, 8]


def test_a_store_bounds_only_monarchs_retained_tables():
    rec = Recorder("h", enabled=True)
    actor = hash_id("w-1[0]")
    rec.actor(actor, hash_id("w-1"), 0, "w-1[0]", "w[0]")
    rec.message(rec.new_id(), 100, 110, 150, hash_id("<root>"), actor, "step", 3, ok=True)  # in 1970
    store = Store()
    store.absorb(rec.take())
    store.retain(3600)
    assert set(RETAINED) <= set(store.tables)
    assert store.batches("messages_ext") == [] and store.batches("message_status_events_ext") == []
    assert sum(b.num_rows for b in store.batches("actors_ext")) == 1


class Pinger(Actor):
    @endpoint
    def ping(self) -> int:
        return 1


def test_a_jobs_retention_drops_its_old_message_rows(no_leaked_processes):
    job = ProcessJob({"hosts": 1}).enable_telemetry(TelemetryConfig(retention_secs=5))
    state = job.state(cached_path=None)
    q = state.query_engine_client.query
    try:
        w = state.hosts.spawn_procs(per_host={"gpus": 2}).spawn("retained", Pinger)
        for _ in range(5):
            w.ping.call().get()
        count = ("SELECT count(*) AS n FROM message_status_events e JOIN messages m ON e.message_id = m.id "
                 "JOIN actors a ON m.to_actor_id = a.id WHERE a.display_name LIKE 'retained%'")

        def n() -> int:
            return q(count)["rows"][0]["n"]

        # The 10 handled messages' 30 events are kept while younger than 5 s, then they go (each read
        # drops what is older): polled both ways, with no bound on how long the machine takes.
        seen = 0
        while seen == 0:
            seen = n()
            time.sleep(0.05)
        while n() > 0:
            time.sleep(0.2)
        # The actors and their meshes are no rows of messages: kept.
        assert q("SELECT count(*) AS n FROM actors WHERE display_name LIKE 'retained%'")["rows"] == [{"n": 2}]
    finally:
        job.kill()
