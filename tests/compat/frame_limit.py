"""``codec_max_frame_length``: a call whose message is longer than the limit fails with
``SupervisionError``; under a higher limit the same call goes through.  Runs unchanged on monarch
and on torchmonarch 0.7.0 (tests/compat/test_api_compat.py compares them).

With the argument ``after`` (monarch only: Monarch's channel to the actor breaks and later calls
fail after a 40 s wait) it goes on: the actor still answers, an answer over the limit fails its
call at once, and the error says which setting to raise.
"""

import re
import sys
import time

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


# A refused message is a supervision event of its sender too: the client's hook hears of it
# (Monarch's default hook would end this program).
heard: list = []
monarch.actor.unhandled_fault_hook = lambda failure: heard.append(str(failure))


def hook_heard_of_it() -> bool:
    deadline = time.monotonic() + 60
    while not any("rejecting oversize frame" in h for h in heard) and time.monotonic() < deadline:
        time.sleep(0.1)
    return any(re.search(r"rejecting oversize frame: len=[0-9]+ > max=1048576.*CODEC_MAX_FRAME_LENGTH", h) for h in heard)


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
    print("the hook heard of it:", hook_heard_of_it())
    if sys.argv[1:] == ["after"]:
        print("then:", packer.count.call_one([b"abcd"]).get())
        try:
            packer.make.call_one(2 * MiB).get()
        except SupervisionError as e:
            print("a 2 MiB answer was refused:", "len=" in str(e), "codec_max_frame_length" in str(e))
        print("still:", len(packer.make.call_one(1000).get()))
        procs.stop().get()
print("default limit", get_global_config()["codec_max_frame_length"])
