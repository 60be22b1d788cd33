"""The one run driver: what a run does next, decided and performed, on a host of the fleet and in one process.

- `run`    — `RunDriver`: the loop over the kernel (apply what arrived, decide, perform, park or wait)
- `staging` — `Staged`: events folded and not yet written, written several to a message; what waits for them
- `ports`  — what it runs over: a run log (`EventLog`: JetStream's `runtime.log.RunLog` or
             `runtime.log.memory.MemoryRunLog`), the ports where effects go (`Ports`: a host's
             `runtime.host.driver.HostPorts`, or `LocalPorts`), the model side (`Model`)
- `inputs` — the one primitive for input from outside a run: a person's answer or verdict, checked and
             recorded, whoever gives it; what time alone settles (a question's timeout)
- `local`  — the driver in one process: tools run here, the caller's approver and answerer asked (`run_task`)
"""

from runtime.driver.ports import EventLog, Inbound, Ports
from runtime.driver.run import RunDriver

__all__ = ["EventLog", "Inbound", "Ports", "RunDriver"]
