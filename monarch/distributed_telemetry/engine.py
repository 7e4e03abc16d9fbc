"""Compatibility name: Monarch's ``monarch.distributed_telemetry.engine.QueryEngine``, which runs SQL over
the tables a telemetry actor holds.  monarch's tables live on the host agents; its ``QueryEngine`` is
built from a job's hosts (``monarch._workbench.job_services``)."""

from monarch._workbench.job_services import QueryEngine  # noqa: F401
