"""Compatibility only: Monarch's ``monarch._src.job.job`` names, aliases of ``monarch.job``'s; the
internals of Monarch's job classes (``LoginJob``, ``ProcessState``, ...) are placeholders (see
``monarch._src._placeholder``)."""

from monarch._src._placeholder import placeholder, placeholder_function
from monarch.job import JobState, JobTrait, LocalJob, MeshAdminConfig, TelemetryConfig, job_load, job_loads  # noqa: F401

BatchJob = placeholder(__name__, "BatchJob")
LoginJob = placeholder(__name__, "LoginJob", "a job of monarch's reserves its hosts through a scheduler")
ProcessState = placeholder(__name__, "ProcessState")
exec_command = placeholder_function(__name__, "exec_command")
