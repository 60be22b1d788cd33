"""The `sa` command line. Each concern registers its commands in its own module:

- `tools_cmds`   — `sa tools`, `sa check`, `sa run` (sandboxed .pym scripts)
- `kernel_cmds`  — `sa constraint` (decoding constraints)
- `model_cmds`   — `sa model serve` (the embedded CPU model server)
- `runtime_cmds` — `sa up`, `sa send`, `sa runs`, `sa replay`, `sa host`, `sa worker`, `sa status`
- `dlq_cmds`     — `sa dlq`, `sa dlq replay` (dead-lettered tool jobs)
"""

from runtime.cli import dlq_cmds, kernel_cmds, model_cmds, runtime_cmds, tools_cmds  # noqa: F401  (registers)
from runtime.cli.app import app


def main() -> None:
    app()
