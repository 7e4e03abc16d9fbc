"""The private module paths Monarch's own tests import beside its public API: they import, and the
few behaviours those tests read through them hold (a concurrent endpoint answers through its own
port; proc-mesh spawn callbacks see each new mesh, until unregistered).  Runs unchanged on monarch
and on torchmonarch 0.7.0 (tests/compat/test_api_compat.py compares them).
"""

import importlib

from monarch.actor import Actor, concurrent_endpoint, endpoint, this_host

PATHS = {
    "monarch._rust_bindings.monarch_hyperactor.actor": ["MethodSpecifier", "PythonMessage", "PythonMessageKind"],
    "monarch._rust_bindings.monarch_hyperactor.buffers": ["Buffer", "FrozenBuffer"],
    "monarch._rust_bindings.monarch_hyperactor.mailbox": ["Mailbox", "PortId", "PortReceiver", "PortRef",
                                                         "UndeliverableMessageEnvelope"],
    "monarch._rust_bindings.monarch_hyperactor.pickle": ["PendingMessage", "pickle", "_get_mesh_pop_count",
                                                        "_reset_mesh_pop_count", "_get_pending_reserve_count",
                                                        "_reset_pending_reserve_count"],
    "monarch._rust_bindings.monarch_hyperactor.pympsc": ["PyTestSender", "Receiver", "channel_for_test"],
    "monarch._rust_bindings.monarch_hyperactor.proc": ["ActorAddr"],
    "monarch._rust_bindings.monarch_hyperactor.pytokio": ["PythonTask", "Shared"],
    "monarch._rust_bindings.monarch_hyperactor.shape": ["Point", "Shape", "Slice"],
    "monarch._rust_bindings.monarch_hyperactor.supervision": ["MeshFailure", "SupervisionError"],
    "monarch._rust_bindings.monarch_hyperactor.actor_mesh": ["PythonActorMesh", "hold_gil_for_test"],
    "monarch._rust_bindings.monarch_hyperactor.proc_mesh": ["ProcMesh"],
    "monarch._rust_bindings.monarch_extension.panic": ["panicking_function"],
    "monarch._src.actor.actor_mesh": ["ActorMesh", "Channel", "Port", "ValueMesh", "context", "attach",
                                      "_client_context", "current_rank", "Context", "Instance"],
    "monarch._src.actor.future": ["Future"],
    "monarch._src.actor.endpoint": ["endpoint"],
    "monarch._src.actor.host_mesh": ["HostMesh", "_spawn_admin", "this_host", "this_proc"],
    "monarch._src.actor.logging": ["_pending_flush_tasks"],
    "monarch._src.actor.pickle": ["flatten", "unflatten"],
    "monarch._src.actor.mpsc": ["Receiver"],
    "monarch._src.actor.waker": ["Event", "PyTestWaker"],
    "monarch._src.actor.proc_mesh": ["HyProcMesh", "ProcMesh", "get_or_spawn_controller",
                                     "register_proc_mesh_spawn_callback", "unregister_proc_mesh_spawn_callback"],
    "monarch._src.actor.bootstrap": ["attach_to_workers"],
    "monarch._src.job.job": ["JobState", "JobTrait", "LoginJob", "ProcessState", "TelemetryConfig"],
    "monarch._src.job.process": ["ProcessJob"],
    "monarch.tools.config": ["Config"],
    "monarch.tools.config.workspace": ["Workspace"],
}
missing = [f"{path}.{name}" for path, names in PATHS.items() for name in names
           if not hasattr(importlib.import_module(path), name)]
print("private names missing:", missing)

from monarch._rust_bindings.monarch_hyperactor.supervision import MeshFailure  # noqa: E402
from monarch._src.actor.future import Future  # noqa: E402
from monarch._src.job.process import ProcessJob  # noqa: E402
import monarch.actor  # noqa: E402
import monarch.job  # noqa: E402

from monarch._rust_bindings.monarch_hyperactor.buffers import Buffer  # noqa: E402
from monarch._src.actor.actor_mesh import Instance, context  # noqa: E402

print("the client's instance is an Instance:", isinstance(context().actor_instance, Instance))
buf = Buffer()
print("buffer writes:", buf.write(b"yellow\nsub"), buf.write(bytearray(b"marine")), len(buf))
frozen = buf.freeze()
# (not readline: 0.7.0's returns all that is left but moves past the line without its newline)
print("frozen:", len(buf), len(frozen), frozen.read(3), len(frozen), frozen.read(), frozen.read())
print("the same objects as the public ones:", MeshFailure is monarch.actor.MeshFailure, Future is monarch.actor.Future, ProcessJob is monarch.job.ProcessJob)


class Gate(Actor):
    @concurrent_endpoint
    async def wait(self) -> int:
        return 1

    @endpoint
    async def plain(self) -> int:
        return 2


print("answers through its own port: concurrent", Gate.wait._explicit_response_port,
      "plain", Gate.plain._explicit_response_port)

from monarch._src.actor.proc_mesh import (  # noqa: E402
    register_proc_mesh_spawn_callback,
    unregister_proc_mesh_spawn_callback,
)

seen: list = []
register_proc_mesh_spawn_callback(seen.append)
procs = this_host().spawn_procs(per_host={"gpus": 1})
unregister_proc_mesh_spawn_callback(seen.append)
later = this_host().spawn_procs(per_host={"gpus": 1})
print("spawn callbacks saw:", len(seen), seen[0] is procs)
procs.stop().get()
later.stop().get()
print("done")
