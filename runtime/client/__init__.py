"""What an outside process does with the fleet: give agents tasks, hold their runs, steer and check them.

    async with await Client.connect() as client:
        handle = await client.start("calc", "17 * 23 + 4")
        print(await handle.result(timeout=60))

- `client`  — `Client`: connect, `start` (idempotent by task id) -> `RunHandle`, `run`, runs, threads, status
- `handle`  — `RunHandle`: `result` (or `RunFailedError`; a cancel: `RunCancelledError`), `events`, `tokens`,
              `approve` / `deny`, `questions` / `answer`, `fork`, `replay`, `verify`
- `sync`    — `SyncClient`: the same, blocking, for code that is not async
- `submit`  — a task stored exactly once, or `NotSent` saying why
- `control` — `Control`: the operator commands (cancel, approve with edits, deny, answer), checked against
              the log
- `fork`    — a new run from any past event of another, with "what if" edits, nothing re-run
- `replay`  — a run's timeline and live view, `verify` (the kernel re-decides the log)
- `diff`    — where two runs (a fork and its source) diverge
- `status`  — hosts, partitions, workers, queue depths, runs in flight
- `terminal` — run content as a terminal shows it: control characters made visible, never markup; a
              console as wide as its lines when it prints into a pipe
- `work`    — tool jobs not done yet (and why earlier deliveries ended), dead letters and their replay
- `schedules` — `Schedules` (`client.schedules`): add, list, pause, resume, delete the cluster's schedules

`sa` and `sa ui` reach runs through this package and nothing else.
"""

from runtime.client.client import Client, RunInfo
from runtime.client.control import ControlError, Pending, Question
from runtime.client.fork import (
    BundleEdit,
    EditedCall,
    Forked,
    ForkEdit,
    ForkError,
    OutputEdit,
    ReplyEdit,
    SystemEdit,
)
from runtime.client.handle import RunCancelledError, RunError, RunFailedError, RunHandle
from runtime.client.schedules import Schedules
from runtime.client.submit import NotSent
from runtime.client.sync import SyncClient, SyncRunHandle
from runtime.client.verify import Verification

__all__ = ["BundleEdit", "Client", "ControlError", "EditedCall", "ForkEdit", "ForkError", "Forked",
           "NotSent", "OutputEdit", "Pending", "Question", "ReplyEdit", "RunCancelledError", "RunError",
           "RunFailedError", "RunHandle", "RunInfo", "Schedules", "SyncClient", "SyncRunHandle", "SystemEdit",
           "Verification"]
