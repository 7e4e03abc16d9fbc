# The first half of the reserve-once pattern of PyTorch Monarch's job documentation (monarch.job,
# docs/source/examples/ddp/spmd_job.py "reload a cached job"): make a job and let state() cache it
# at .monarch/job_state.pkl. reload_job.py picks it up from another process. Monarch 0.7.0 API only.
from monarch.actor import Actor, endpoint, current_rank
from monarch.job import ProcessJob


class Hello(Actor):
    @endpoint
    def hello(self) -> str:
        return f"hello from rank {current_rank().rank}"


job = ProcessJob({"trainers": 2})
state = job.state()                       # applies the job and caches it at .monarch/job_state.pkl
procs = state.trainers.spawn_procs(per_host={"gpus": 1})
print(list(procs.spawn("hello", Hello).hello.call().get().values()))
print(f"apply_id={job.apply_id}")
