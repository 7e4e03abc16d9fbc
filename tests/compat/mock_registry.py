"""``patch_actor``'s registry (Monarch's ``monarch._src.actor.mock``): ``_actor_registry`` holds the
patches in force, keyed by the original class; ``get_actor_mock_registry_state()`` copies them out
and ``set_actor_mock_registry_state()`` adds them back (what reaches a proc), after which spawning
the original spawns the mock again.  Runs unchanged on monarch and on torchmonarch 0.7.0
(tests/compat/test_api_compat.py compares them)."""

from monarch._src.actor.mock import (
    _actor_registry,
    get_actor_class,
    get_actor_mock_registry_state,
    patch_actor,
    set_actor_mock_registry_state,
)
from monarch.actor import Actor, endpoint, this_host


class Real(Actor):
    @endpoint
    def kind(self) -> str:
        return "real"


class Fake(Actor):
    @endpoint
    def kind(self) -> str:
        return "fake"


print("empty:", len(_actor_registry), get_actor_mock_registry_state())
with patch_actor(Real, Fake):
    state = get_actor_mock_registry_state()
    print("while patched:", Real in _actor_registry, state == {Real: Fake}, get_actor_class(Real) is Fake)
    state_copy_is_separate = state is not _actor_registry
print("after:", len(_actor_registry), get_actor_class(Real) is Real, "copy kept:", state == {Real: Fake},
      state_copy_is_separate)
set_actor_mock_registry_state(state)
print("state put back:", get_actor_class(Real) is Fake, len(_actor_registry))
procs = this_host().spawn_procs(per_host={"gpus": 1})
print("spawned after the state is put back:", procs.spawn("a", Real).kind.call_one().get())
set_actor_mock_registry_state({})
print("an empty state adds nothing, removes nothing:", get_actor_class(Real) is Fake, len(_actor_registry))
procs.stop().get()
print("done")
