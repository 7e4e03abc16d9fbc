"""reserve / load_live on the local scheduler, without the CLI."""

import pytest

from monarch.errors import StateError
from monarch.job import job_load
from monarch._workbench import reserve as reserve_mod
from monarch._workbench.reserve import load_live, release, reserve
from monarch._workbench.state import JobSpec, StatePaths
from monarch_schedulers.local import LocalScheduler


@pytest.fixture
def reservation(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = reserve(JobSpec("local", 1, 1), name="default", paths=StatePaths(str(tmp_path)))
    yield r
    release(r.record, r.path)


def test_a_scheduler_that_cannot_answer_is_not_a_dead_job(reservation, monkeypatch):
    def flaky(self, job_id, job_dir=None):
        raise OSError("controller timed out")

    monkeypatch.setattr(LocalScheduler, "describe", flaky)
    assert reserve_mod.describe(reservation.record).state.value == "UNKNOWN"
    record, _ = load_live(path=reservation.path)
    assert record.job_id == reservation.record.job_id


def test_job_load_and_a_released_job(reservation):
    job = job_load(reservation.path)
    assert job.active
    release(reservation.record, None)
    with pytest.raises(StateError, match="is gone"):
        job.state()


def test_agents_started_for_a_reservation_preload_the_actor_api(tmp_path):
    """The monarch layer names what the agents' zygotes import (monarch_agents/ and monarch_schedulers/ may not)."""
    from monarch._workbench.reserve import scheduler_for
    from monarch._workbench.state import JobSpec

    spec = JobSpec("local", 2, 1, {})
    text = scheduler_for(spec).dryrun(spec, str(tmp_path / "job")).text
    assert text.count("--preload monarch.actor") == 2
