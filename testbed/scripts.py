"""Tool scripts for tests and benchmarks of a fleet: written into a bundle's `tools/` folder, they give a
run real sandboxed work with a workspace write per step, so fault tests and benches can count every write.

    (folder / "tools" / "step.pym").write_text(APPEND_LINE)
    (folder / "tools" / "submit.pym").write_text(SUBMIT)
"""

APPEND_LINE = '''\
"""Append one line to a file of the workspace (read it, return the write for the host)."""
from grail import Input

file: str = Input("file", default="log.txt")
line: str = Input("line")
spin: int = Input("spin", default=0)

total = 0
for i in range(spin):
    total += i
old = ""
try:
    old = open(f"/data/{file}").read()
except FileNotFoundError:
    old = ""
new = old + line + "\\n"
{"writes": [{"path": f"/data/{file}", "content": new}], "lines": len(new.splitlines())}
'''

SUBMIT = '''\
"""Finish the task with its answer."""
from grail import Input

answer: str = Input("answer")

{"answer": answer}
'''

# A trivial tool: what a call costs when the script itself costs almost nothing (the benches' `add`).
ADD = '''\
"""Add two numbers and describe the sum."""
from grail import Input

a: int = Input("a")
b: int = Input("b")

{"sum": a + b, "text": "the sum is " + str(a + b)}
'''

# A tool that runs until its sandbox run is stopped: what cancel, interrupt and limit tests stop.
SPIN = '''"""Loop until stopped (a tool that never finishes by itself)."""
from grail import Input

label: str = Input("label", default="")

n = 0
while True:
    n += 1
{"n": n}
'''


__all__ = ["APPEND_LINE", "SPIN", "SUBMIT"]
