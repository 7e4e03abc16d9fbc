"""``codec_max_frame_length``: a call whose message is longer than the limit fails with
``SupervisionError``; under a higher limit the same call goes through.  Runs unchanged on monarch
and on torchmonarch 0.7.0 (tests/compat/test_api_compat.py compares them).

With the argument ``after`` (monarch only: Monarch's channel to the actor breaks and later calls
fail after a 40 s wait) it goes on: the actor still answers, an answer over the limit fails its
call at once, and the error says which setting to raise.
"""

import sys

import monarch.actor
from monarch.actor import Actor, endpoint, this_host
from monarch.config import configured, get_global_config

try:
    from monarch.actor import SupervisionError
except ImportError:  # torchmonarch 0.7.0 exports it only from its Rust bindings
    from monarch._rust_bindings.monarch_hyperactor.supervision import SupervisionError

MiB = 1 << 20


class Packer(Actor):
    @endpoint
    def count(self, parts: list) -> int:
        return sum(len(p) for p in parts)

    @endpoint
    def make(self, n: int) -> bytes:
        return bytes(n)


# What a refused message becomes in Monarch is a supervision event too: this program only
# looks at the call that failed.
monarch.actor.unhandled_fault_hook = lambda failure: None
parts = [bytes(MiB // 4) for _ in range(4)]  # 1 MiB, and the call's envelope on top

with configured(codec_max_frame_length=2 * MiB):
    procs = this_host().spawn_procs(per_host={"procs": 1})
    packer = procs.spawn("packer", Packer)
    print("limit", get_global_config()["codec_max_frame_length"], "passes:", packer.count.call_one(parts).get())
    procs.stop().get()

with configured(codec_max_frame_length=MiB):
    print("limit", get_global_config()["codec_max_frame_length"])
    procs = this_host().spawn_procs(per_host={"procs": 1})
    packer = procs.spawn("packer", Packer)
    print("small call:", packer.count.call_one([b"abc"]).get())
    try:
        packer.count.call_one(parts).get()
        print("a 1 MiB call went through")
    except SupervisionError:
        print("a 1 MiB call was refused: SupervisionError")
    if sys.argv[1:] == ["after"]:
        print("then:", packer.count.call_one([b"abcd"]).get())
        try:
            packer.make.call_one(2 * MiB).get()
        except SupervisionError as e:
            print("a 2 MiB answer was refused:", "len=" in str(e), "codec_max_frame_length" in str(e))
        print("still:", len(packer.make.call_one(1000).get()))
        procs.stop().get()
print("default limit", get_global_config()["codec_max_frame_length"])
