"""Reads jobs and metrics in a loop from its own process while a job writes them (see
test_jobs_concurrency.py). Usage: python _reader.py WORKSPACE JOB_ID OUT.json"""

import json
import sys
import time
import traceback

from jobs import api

ws, job_id, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
reads, errors, counts, last_id, seen = 0, [], [], 0, 0
status = "?"
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    try:
        status = api.get_job(job_id, workspace=ws).status
        api.list_jobs(workspace=ws)
        new = api.job_metrics(job_id, after_id=last_id, workspace=ws)
        if new:
            last_id = new[-1].id
            seen += len(new)
        api.latest_metrics(job_id, workspace=ws)
        api.job_events(job_id, workspace=ws)
        reads += 1
        counts.append(seen)
    except Exception:
        errors.append(traceback.format_exc())
    if status in ("succeeded", "failed", "cancelled", "interrupted"):
        break
with open(out, "w") as f:
    json.dump({"reads": reads, "errors": errors, "counts": counts, "seen": seen, "status": status}, f)
