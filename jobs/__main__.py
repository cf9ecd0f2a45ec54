"""``python -m jobs jobs list``, ``python -m jobs worker``: the job commands on their own."""

from jobs.cli import main

main()
