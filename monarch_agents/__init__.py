"""monarch's long-lived processes and the runtime inside them (installed as ``monarch_agents``).

Wire and transport: ``wire`` (frames, pickles with out-of-band buffers), ``transport``
(CURVE-encrypted ZeroMQ between hosts), ``ipc`` (authenticated Unix sockets on one host),
``shm`` (shared memory for large buffers), ``zap`` (who may connect), ``keys``.
Runtime: ``messages`` (every message that crosses a process), ``runtime`` (ports, answers,
deaths), ``future``, ``ports``, ``supervision``, ``context``, ``errors``, ``client`` (a
client process's runtime).
Processes: ``host_agent`` (one per host), ``zygote`` (its warm fork server), ``proc_agent``
(hosts actors).

The host agent is a set of services (``services/``): procs, runs and shells today; the
workspace mount, telemetry and debug sessions plug in the same way.  A service is a
:class:`monarch_agents.services.Service` subclass with a ``name``, ``handlers()`` (the
message types it handles; they run in order on the service's own thread, off the IO
thread), ``info()`` (what it adds to ``monarch status``, under ``HostInfo.services[name]``)
and ``stop(deadline)`` (the agent stops services in the reverse of their order, all
against one deadline, then exits normally).  Adding one is a new module in
``monarch_agents/services/`` and one line in ``monarch_agents.host_agent.SERVICES``; its messages
go in ``messages`` (or its own module, imported by both ends).

"""
