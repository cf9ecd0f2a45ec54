"""The job system: a SQL queue of validated job configs, a worker that supervises one process
per job, and a Python API (:mod:`jobs.api`) that the CLI and the Streamlit app read through.

Modules, bottom up:

* :mod:`jobs.models`   SQLAlchemy tables (jobs, metrics, job events, schema version).
* :mod:`jobs.db`       engine per database URL, SQLite WAL + busy timeout, lock-retry helper,
                       schema creation and ordered upgrades.
* :mod:`jobs.store`    every state transition as a compare-and-set UPDATE.
* :mod:`jobs.kinds`    registry: kind name -> (pydantic config model, run function); presets.
* :mod:`jobs.progress` :class:`core.progress.ProgressCallback` that writes metric / event rows.
* :mod:`jobs.runner`   ``python -m jobs.runner JOB_ID``: the process that runs one job.
* :mod:`jobs.supervisor` the supervision loop over an executor: claims jobs, watches heartbeats,
                       escalates cancels, judges runners that died, reconciles dead or silent jobs.
* :mod:`jobs.worker`   the local executor: runners in their own process groups (``lolcats worker``);
                       :mod:`jobs.executors.ray_jobs` the Ray one.
* :mod:`jobs.api`      plain-dataclass functions: submit_job, list_jobs, get_job, ...
* :mod:`jobs.cli`      ``lolcats jobs ...`` and ``lolcats worker``.
"""
