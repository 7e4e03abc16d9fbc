# The second half of the reserve-once pattern (see cache_job.py): another process loads the cached
# job with job_load, uses its hosts without a new allocation, and kills it. Monarch 0.7.0 API only.
from monarch.actor import Actor, endpoint, current_rank
from monarch.job import job_load


class Hello(Actor):
    @endpoint
    def hello(self) -> str:
        return f"hello again from rank {current_rank().rank}"


job = job_load(".monarch/job_state.pkl")
print(f"apply_id={job.apply_id}")
state = job.state()
procs = state.trainers.spawn_procs(per_host={"gpus": 1})
print(list(procs.spawn("hello", Hello).hello.call().get().values()))
job.kill()
print(f"active={job.active}")
