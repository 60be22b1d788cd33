"""`python -m runtime.modelserver`: the same server as `sa model serve`, without importing the whole CLI.

`start_model_server` launches this entry point, so a child process never depends on the `sa` script being
on PATH or on the other command modules importing cleanly.
"""

import argparse
from pathlib import Path

from runtime.modelserver.app import SERVED_MODEL_NAME
from runtime.modelserver.launch import serve


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m runtime.modelserver", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed when ready)")
    p.add_argument("--model", type=Path, default=None, help="a GGUF file or a converted folder")
    p.add_argument("--served-model-name", default=SERVED_MODEL_NAME)
    p.add_argument("--default-max-tokens", type=int, default=512)
    a = p.parse_args()
    serve(
        a.host,
        a.port,
        model_path=a.model,
        model_name=a.served_model_name,
        default_max_tokens=a.default_max_tokens,
    )


if __name__ == "__main__":
    main()
