"""``gather_mount``: a file its host appends to, or replaces with a shorter one, reads as the host
has it now through the mount; a new file shows.  Runs unchanged on monarch and on torchmonarch
0.7.0 (tests/compat/test_api_compat.py compares them).  Each change is waited for (at most 20 s)
and the program says whether it showed, not how long it took.

With the argument ``at_once`` (monarch only: Monarch's hosts notice changes and tell the mount
within 50 ms, so a read right after a change may still see the old bytes) every change is read
once, right after it is made, with no wait.
"""

import os
import shutil
import sys
import tempfile
import time

from monarch.actor import this_host
from monarch.gather_mount import gather_mount


AT_ONCE = sys.argv[1:] == ["at_once"]


def shows(path, want):
    deadline = time.monotonic() + (0 if AT_ONCE else 20)
    while True:
        try:
            with open(path) as f:
                got = f.read()
        except FileNotFoundError:
            got = None
        if got == want or time.monotonic() > deadline:
            return got == want
        time.sleep(0.05)


base = tempfile.mkdtemp(prefix="gather_changes_")
src, mnt = os.path.join(base, "src"), os.path.join(base, "mnt")
os.makedirs(src)
log, state = os.path.join(src, "log.txt"), os.path.join(src, "state.txt")
with open(log, "w") as f:
    f.write("one\n")
with open(state, "w") as f:
    f.write("version one, long\n")
try:
    with gather_mount(this_host(), src, mnt):
        seen_log, seen_state = os.path.join(mnt, "log.txt"), os.path.join(mnt, "state.txt")
        print("first reads:", repr(open(seen_log).read()), repr(open(seen_state).read()))
        print("stat size:", os.stat(seen_log).st_size)
        with open(log, "a") as f:
            f.write("two\n")
        print("appended line shows:", shows(seen_log, "one\ntwo\n"), "size", os.stat(seen_log).st_size)
        with open(state, "w") as f:
            f.write("v2\n")
        print("shorter replacement shows:", shows(seen_state, "v2\n"), "size", os.stat(seen_state).st_size)
        with open(os.path.join(src, "new.txt"), "w") as f:
            f.write("new\n")
        print("new file shows:", shows(os.path.join(mnt, "new.txt"), "new\n"), sorted(os.listdir(mnt)))
        try:
            open(seen_log, "a")
        except OSError as e:
            print("writing is refused:", type(e).__name__)
    print("unmounted:", not os.path.ismount(mnt))
finally:
    shutil.rmtree(base, ignore_errors=True)
