"""Shared pieces of the run-control tests (a helper module, not collected): a bundle with a busy-looping
tool and tools under approval rules, the scripted model that drives it, and `sa` run as a process."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from host_helpers import SUBMIT

from runtime.testing import hermes_call, last_message
from testbed.fleet import CLI
from testbed.scripts import SPIN

TRANSFER = '''"""Send money to an account."""
from grail import Input

amount: int = Input("amount", description="how much")
to: str = Input("to", description="the account")

{"sent": amount, "to": to}
'''

REFUND = '''"""Refund a customer."""
from grail import Input

amount: int = Input("amount")

{"refunded": amount}
'''


def control_bundle(root: Path, base_url: str, *, refund_timeout: str = "2s") -> Path:
    """Agent `ctl`: `spin` (a busy loop bounded at 60 s), `transfer` (waits for an operator when the
    amount is over 100, role finance), `refund` (always waits, approved on timeout), `submit`."""
    folder = root / "ctl"
    (folder / "tools").mkdir(parents=True, exist_ok=True)
    for name, text in (("submit", SUBMIT), ("spin", SPIN), ("transfer", TRANSFER), ("refund", REFUND)):
        (folder / "tools" / f"{name}.pym").write_text(text)
    path = folder / "bundle.yaml"
    path.write_text(f"""\
name: ctl
system_prompt: You move money with tools.
model: {{adapter: hermes, base_url: '{base_url}', name: scripted}}
constraint: {{strategy: ebnf}}
tools:
  - tools/submit.pym
  - path: tools/spin.pym
    limits: {{max_duration: 60s}}
  - path: tools/transfer.pym
    approval:
      when: {{arg: amount, op: ">", value: 100}}
      role: finance
  - path: tools/refund.pym
    approval: {{timeout: {refund_timeout}, on_timeout: approve, role: support}}
termination: {{terminal_tool: submit, max_turns: 4}}
""")
    return path


def control_model(body: dict[str, Any]) -> str:
    """`spin` -> spin; `pay: N to X` -> transfer; `refund: N` -> refund; `compute` -> submit at once.
    After a tool's response, submit what the tool (or the approver) said, so the answer shows it."""
    task = next(m["content"] for m in body["messages"] if m["role"] == "user")
    last = last_message(body)
    if "<tool_response>" in last:
        return hermes_call("submit", {"answer": last[-300:]})
    if task.startswith("spin"):
        return hermes_call("spin", {"label": task})
    if m := re.match(r"pay: (\d+) to (\w+)", task):
        return hermes_call("transfer", {"amount": int(m.group(1)), "to": m.group(2)})
    if m := re.match(r"refund: (\d+)", task):
        return hermes_call("refund", {"amount": int(m.group(1))})
    return hermes_call("submit", {"answer": task})


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


async def sa(url: str, *args: str) -> Result:
    """Run `sa ARGS` against `url` as a separate process (what an operator types)."""
    env = {**os.environ, "NATS_URL": url, "COLUMNS": "200"}
    proc = await anyio.run_process([*CLI, *args], env=env, check=False)
    return Result(proc.returncode, proc.stdout.decode(), proc.stderr.decode())


def tool_messages(body: dict[str, Any]) -> list[str]:
    """The tool results a model request carries (hermes renders them as user `<tool_response>` turns)."""
    return [str(m.get("content")) for m in body["messages"] if "<tool_response>" in str(m.get("content"))]
