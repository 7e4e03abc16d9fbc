"""SQL over a job's telemetry tables, as Monarch names it (``monarch.distributed_telemetry``).

A job with ``enable_telemetry(...)`` serves its tables (README 'Telemetry'); ``state.query_engine_client``
asks them: ``client.query("SELECT ...")`` -> ``{"rows": [...]}``.
"""
