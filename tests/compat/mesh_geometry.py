"""Host and proc meshes as Monarch's runtime describes them: a mesh's region (labels over a strided
slice of the hosts or procs it was cut from), cutting a mesh by a ``Shape`` of its own, a native
mesh still pending (the cut is pending too, and resolves), pickling that keeps things out of the
bytes (``flatten``), a slice that may not shut its hosts down, and a shut-down mesh that lets go.
Monarch's own tests read these through its private paths; this program does too.  Runs unchanged on
monarch and on torchmonarch 0.7.0 (tests/compat/test_api_compat.py compares them).
"""

import os
import threading

import cloudpickle
from monarch._rust_bindings.monarch_hyperactor.pytokio import PythonTask
from monarch._rust_bindings.monarch_hyperactor.shape import Shape, Slice
from monarch._src.actor.pickle import flatten, unflatten
from monarch.actor import Actor, HostMesh, endpoint
from monarch.job import ProcessJob


class Where(Actor):
    @endpoint
    def where(self) -> int:
        return os.getpid()


def show(what: str, region) -> None:
    s = region.slice()
    print(what, region.labels, s.offset, s.sizes, s.strides)


job = ProcessJob({"hosts": 4})
hosts = job.state(cached_path=None).hosts
try:
    show("hosts", hosts.region)
    print("labels", hosts._labels, "stream_logs", hosts.stream_logs)
    native = hosts._hy_host_mesh.block_on()
    print("native region is the mesh's", native.region.labels == hosts.region.labels,
          native.region.slice() == hosts.region.slice())

    odd = hosts._new_with_shape(Shape(labels=["hosts"], slice=Slice(offset=1, sizes=[2], strides=[2])))
    show("odd hosts", odd.region)
    print("odd extent", odd.extent.labels, odd.extent.sizes)
    show("one host by slice()", hosts.slice(hosts=2).region)

    # The native mesh still pending: a cut of it is pending too, and resolves with it.
    release = threading.Event()

    async def later():
        await PythonTask.spawn_blocking(release.wait)
        return native

    hosts._inner_host_mesh = PythonTask.from_coroutine(later()).spawn()
    pending = hosts._new_with_shape(Shape(labels=["hosts"], slice=Slice(offset=3, sizes=[1], strides=[1])))
    print("pending", hosts._hy_host_mesh.poll() is None, pending._hy_host_mesh.poll() is None)
    release.set()
    show("resolved cut", pending._hy_host_mesh.block_on().region)

    procs = odd.spawn_procs(per_host={"gpus": 3})
    print("procs", procs._labels, procs._ndslice.offset, procs._ndslice.sizes, procs._ndslice.strides)
    pids = [pid for _, pid in procs.spawn("where", Where).where.call().get()]
    print("proc labels", procs._labels, "host mesh kept", procs._host_mesh is odd)
    show("native procs", procs._proc_mesh.block_on().region)
    corner = procs._new_with_shape(Shape(labels=["hosts", "gpus"], slice=Slice(offset=1, sizes=[2, 2], strides=[3, 1])))
    print("corner", corner._ndslice.offset, corner._ndslice.sizes, corner._ndslice.strides)
    print("corner ranks", [pids.index(pid) for _, pid in corner.spawn("where2", Where).where.call().get()])

    kept, data = flatten(hosts, lambda obj: isinstance(obj, Slice))
    back = unflatten(data.freeze(), kept)
    print("flattened", type(back).__name__, back.extent.labels, back.extent.sizes)
    print("a copy may not shut down:", end=" ")
    try:
        cloudpickle.loads(cloudpickle.dumps(hosts)).shutdown().get()
        print("it did")
    except RuntimeError:
        print("RuntimeError")

    print("a slice may not shut down:", end=" ")
    try:
        odd.shutdown().get()
        print("it did")
    except RuntimeError as e:
        print("RuntimeError", "reference instead of owned" in str(e))

    hosts.shutdown().get()
    print("shut down lets go", hosts._inner_host_mesh is None)
    try:
        hosts.spawn_procs()
    except RuntimeError as e:
        print("then spawn_procs:", e)
    print("is a HostMesh", isinstance(back, HostMesh))
finally:
    job.kill()
print("done")
