"""What an outside process does with the fleet: run control, fork, replay and verify, diff, status.

- `control` — `Control`: cancel a run, list its pending approvals, approve (with edits) or deny
- `fork`    — `fork`: a new run from any past event of another, with "what if" edits, nothing re-run
- `replay`  — a run's timeline, the live view, `verify` (the kernel re-decides the log)
- `diff`    — where two runs (a fork and its source) diverge
- `status`  — hosts, partitions, workers, queue depths, runs in flight
"""
