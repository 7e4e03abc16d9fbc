"""Compatibility only: Monarch's ``monarch._src.job.job`` names, aliases of ``monarch.job``'s; the
internals of Monarch's job classes (``BatchJob``, ...) are placeholders (see
``monarch._src._placeholder``); ``LoginJob`` and ``ProcessState`` are ``monarch.job.job``'s."""

from monarch._src._placeholder import placeholder, placeholder_function
from monarch.job import JobState, JobTrait, LocalJob, MeshAdminConfig, TelemetryConfig, job_load, job_loads  # noqa: F401
from monarch.job.job import LoginJob, ProcessState  # noqa: F401

BatchJob = placeholder(__name__, "BatchJob")
exec_command = placeholder_function(__name__, "exec_command")
