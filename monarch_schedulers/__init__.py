"""How hosts are obtained and released: one module per scheduler, loaded by name."""

from monarch_schedulers.base import AllocateRequest, Description, HostState, Scheduler, create_scheduler, names

__all__ = ["AllocateRequest", "Description", "HostState", "Scheduler", "create_scheduler", "names"]
