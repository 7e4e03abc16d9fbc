"""monarch.remotemount in Monarch's API: the index and its blocks, a block mount fed by hand, and a
mount of a folder on this host opened, read (a big file comes when read), refreshed under an open
file and closed.  Prints the same on monarch and on torchmonarch 0.7.0."""

import ctypes
import errno
import os
import tempfile
import threading
import time

from monarch._rust_bindings.monarch_extension.chunked_fuse import mount_chunked_fuse
from monarch.actor import this_host
from monarch.remotemount import remotemount
from monarch.remotemount.remotemount import BIG_FILE_THRESHOLD, BLOCK_SIZE, build_index, code_blocks, materialise_block


def write(path, data, bump=0):
    with open(path, "wb") as f:
        f.write(data)
    if bump:  # a later mtime, however coarse the clock
        st = os.stat(path)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + bump))


def mounted(path):
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == path for line in f)


def publish(handle, block, data, stale):
    buf = (ctypes.c_char * BLOCK_SIZE).from_address(handle.block_ptr(block))
    ctypes.memmove(buf, data, len(data))
    handle.receive_block(block, stale)


with tempfile.TemporaryDirectory() as src:
    os.makedirs(os.path.join(src, "pkg"))
    os.makedirs(os.path.join(src, ".monarch"))
    write(os.path.join(src, "train.py"), b"print('train')\n")
    write(os.path.join(src, "pkg", "model.py"), b"LAYERS = 4\n")
    write(os.path.join(src, ".monarch", "state"), b"job state")
    big = bytes(range(256)) * ((BIG_FILE_THRESHOLD + 4096) // 256)
    write(os.path.join(src, "weights.bin"), big)
    os.symlink("train.py", os.path.join(src, "main.py"))

    # -- the index ------------------------------------------------------------------------------
    index = build_index(src, {})
    print("paths", sorted(index))
    print("root", index["/"]["children"], index["/"]["total_size"] == 11 + 15 + len(big))
    print("link", index["/main.py"]["link_target"], "global_offset" in index["/main.py"])
    smalls = sorted(index[v]["global_offset"] for v in ("/train.py", "/pkg/model.py"))
    print("small files first", smalls[1] - smalls[0] in (11, 15), index["/weights.bin"]["global_offset"] == 26)
    print("code blocks", sorted(code_blocks(index)))
    print("unchanged index is equal", build_index(src, index) == index)
    write(os.path.join(src, "pkg", "model.py"), b"LAYERS = 8\n", bump=10**6)
    again = build_index(src, index)
    moved = [v for v in index if "global_offset" in index[v] and again[v]["global_offset"] != index[v]["global_offset"]]
    print("moved", moved, again["/pkg/model.py"]["global_offset"] == BLOCK_SIZE)
    data, used, diverged = materialise_block(index, 0, bytearray(BLOCK_SIZE))
    print("stale block", len(data) == BLOCK_SIZE, used == index["/"]["total_size"], diverged)
    try:
        materialise_block(again, 2, bytearray(BLOCK_SIZE))
    except ValueError:
        print("past the end ValueError")

# -- a block mount fed by hand ------------------------------------------------------------------
now = time.time()
attr = {"st_atime": now, "st_ctime": now, "st_gid": os.getgid(), "st_mtime": now, "st_uid": os.getuid()}
meta = {
    "/": {"attr": {**attr, "st_mode": 0o40755, "st_nlink": 2, "st_size": 4096}, "children": ["a.txt", "b.txt"]},
    "/a.txt": {"attr": {**attr, "st_mode": 0o100644, "st_nlink": 1, "st_size": 5}, "global_offset": 0, "file_len": 5},
    "/b.txt": {"attr": {**attr, "st_mode": 0o100444, "st_nlink": 1, "st_size": 5}, "global_offset": 5, "file_len": 5},
}
faults = []
with tempfile.TemporaryDirectory() as mnt:
    handle = mount_chunked_fuse(meta, 10, mnt, faults.append)
    got = {}
    reader = threading.Thread(target=lambda: got.update(a=open(os.path.join(mnt, "a.txt"), "rb").read()))
    reader.start()
    while not faults:
        time.sleep(0.05)
    print("waiting read faulted", faults, reader.is_alive())
    publish(handle, 0, b"hello" + b"junk!", ["/b.txt"])
    reader.join(30)
    print("woken read", got)
    try:
        open(os.path.join(mnt, "b.txt"), "rb").read()
    except OSError as e:
        print("stale file", errno.errorcode[e.errno])
    print("modes", oct(os.stat(os.path.join(mnt, "b.txt")).st_mode), sorted(os.listdir(mnt)))
    handle.unmount()
    print("unmounted", not mounted(mnt))

# -- a folder mounted on this host --------------------------------------------------------------
with tempfile.TemporaryDirectory() as src, tempfile.TemporaryDirectory() as mnt:
    write(os.path.join(src, "config.json"), b'{"lr": 0.1}')
    write(os.path.join(src, "weights.bin"), big)
    rm = remotemount(this_host(), src, mnt)
    rm.open()
    print("listing", sorted(os.listdir(mnt)))
    with open(os.path.join(mnt, "weights.bin"), "rb") as f:
        print("big file read on demand", f.read() == big)
    fh = open(os.path.join(mnt, "config.json"), "rb")
    print("before", fh.read())
    write(os.path.join(src, "config.json"), b'{"lr": 0.01}', bump=10**6)
    write(os.path.join(src, "new.txt"), b"new")
    rm.refresh()
    fh.seek(0)
    print("open file after refresh", fh.read())
    fh.close()
    print("listing", sorted(os.listdir(mnt)))
    rm.refresh()
    rm.close()
    print("closed, mounted:", mounted(mnt))
print("done")
