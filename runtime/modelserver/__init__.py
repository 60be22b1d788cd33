"""The embedded CPU model server: SmolLM2-135M-Instruct behind vLLM's OpenAI-compatible request format.

Public API (everything else in this package is internal):

- `start_model_server(port=0) -> ServerProcess` — a child process; `.base_url`, `.stop()`. Waits for /health.
- `serve_in_thread(host, port=0, engine=None) -> ServerHandle` — the same on a thread; `.base_url`, `.stop()`.
- `serve(host, port)` — blocking; what `sa model serve` runs.
- `SERVED_MODEL_NAME` (`smollm2-135m-instruct`) and `MODEL_ALIASES` (`local`).

Requests use `structured_outputs` (json, regex, choice, grammar, json_object, structural_tag) or
`response_format`, enforced with xgrammar token masks. Heavy imports (torch, transformers, xgrammar) happen
only when a server is started, so importing this package is cheap.
"""

from runtime.modelserver.app import MODEL_ALIASES, SERVED_MODEL_NAME, create_app
from runtime.modelserver.launch import ServerHandle, ServerProcess, serve, serve_in_thread, start_model_server

__all__ = [
    "MODEL_ALIASES",
    "SERVED_MODEL_NAME",
    "ServerHandle",
    "ServerProcess",
    "create_app",
    "serve",
    "serve_in_thread",
    "start_model_server",
]
