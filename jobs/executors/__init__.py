"""Executors: where the runner process of a claimed job runs.

Every executor starts the same command, ``python -m jobs.runner <id>``, which validates the
stored config, runs the kind, writes heartbeats, metrics and events, and records its own outcome
in the job database. One loop (:class:`jobs.supervisor.Supervisor`) claims queued jobs, watches
heartbeats and escalates cancels for every executor; the executor starts, polls, terminates and
kills attempts and judges runners that died without recording anything. The database stays the
source of truth whichever executor runs a job.

* ``local`` (:class:`jobs.worker.Worker`, the default): one process group per job on this
  machine (``lolcats worker``).
* ``ray`` (:class:`jobs.executors.ray_jobs.RayWorker`): one Ray job per attempt through the Ray
  Jobs API (``lolcats worker --executor ray --ray-address http://HEAD:8265``). Needs the optional
  dependency (``pip install -r requirements-ray.txt``), a job database every node can reach
  (PostgreSQL, or SQLite when the cluster is this machine) and the workspace at the same path on
  every node.
"""

EXECUTORS = ("local", "ray")
