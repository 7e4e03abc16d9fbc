"""Two teams of actors on the two hosts of a ProcessJob talk to each other, each actor to its
counterpart (the same rank) on the other host; prints what the client gets back.

Exercises: ``ProcessJob(...).state().hosts``, ``hosts.slice(hosts=N).spawn_procs(per_host=...)``,
``spawn`` with arguments, ``call``/``call_one``/``slice``, ``current_rank()``, an ``ActorMesh``
passed as an argument and sliced inside an actor (``slice(**current_rank())``), and ``job.kill()``.
What the actors print goes to their host's proc logs, which the test reads.
"""

from monarch.actor import Actor, current_rank, endpoint
from monarch.job import ProcessJob

job = ProcessJob({"hosts": 2})
hosts = job.state().hosts


class Player(Actor):
    def __init__(self, team: str):
        self.team = team
        self.rank = current_rank().rank
        self.heard: list[str] = []

    @endpoint
    def name(self) -> str:
        return f"{self.team}{self.rank}"

    @endpoint
    def pair_with(self, other_team) -> str:
        # The actor of the other team at this actor's own coordinates.
        self.partner = other_team.slice(**current_rank())
        return f"{self.team}{self.rank} pairs with {self.partner.name.call_one().get()}"

    @endpoint
    def serve(self, ball: str) -> str:
        reply = self.partner.receive.call_one(f"{ball} from {self.team}{self.rank}").get()
        return f"{self.team}{self.rank} served, {reply}"

    @endpoint
    def receive(self, ball: str) -> str:
        self.heard.append(ball)
        print(f"player {self.team}{self.rank} received: {ball}", flush=True)
        return f"{self.team}{self.rank} returned it"

    @endpoint
    def tally(self) -> list[str]:
        return self.heard


red = hosts.slice(hosts=0).spawn_procs(per_host={"gpus": 2}).spawn("red", Player, "red")
blue = hosts.slice(hosts=1).spawn_procs(per_host={"gpus": 2}).spawn("blue", Player, "blue")

print(sorted(red.name.call().get().values()), sorted(blue.name.call().get().values()))
for line in sorted(red.pair_with.call(blue).get().values()) + sorted(blue.pair_with.call(red).get().values()):
    print(line)
for rank in range(2):
    print(red.slice(gpus=rank).serve.call_one("ball 1").get())
print(sorted(v for v in blue.serve.call("ball 2").get().values()))
print("red heard", [red.slice(gpus=r).tally.call_one().get() for r in range(2)])
print("blue heard", [blue.slice(gpus=r).tally.call_one().get() for r in range(2)])
job.kill()
print("teams done")
