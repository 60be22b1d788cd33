"""`model.server: auto`: ask a model server once, at start, which one it is.

    detect("http://gpu:8000/v1")   # -> ("sglang", "GET /get_server_info answered"), or DialectError

Each server has a cheap tell, a route only it serves; they are tried in an order where no earlier tell can
be answered by a later server:

| server | tell |
|---|---|
| OpenAI | its host name (`api.openai.com`), no request |
| llama.cpp `llama-server` | `GET /props` (its slots and generation settings) |
| llama-cpp-python's server | `GET /v1/models` listing models `owned_by: "me"` and `permissions` |
| Ollama | `GET /api/version` |
| LM Studio | `GET /api/v1/models` (0.4 on) or `GET /api/v0/models` |
| TGI | `GET /info` holding `model_id` |
| SGLang | `GET /get_server_info` or `GET /server_info` |
| vLLM | `GET /version` |

Why once and at start: the dialect decides the request's fields, so it must be known before the first
request, and it does not change while the server runs. The answer is kept per URL for the process's life
and recorded on every `model.requested` event (`dialect`), so a replay, a trace and the inspector show which
dialect was spoken. A server that answers none of the tells is an error that says to set `model.server`.
"""

from __future__ import annotations

import threading
from typing import Any

import httpx2

from runtime.model.dialects import DialectError

#: seconds each probe may take
PROBE_TIMEOUT = 5.0

_found: dict[str, tuple[str, str]] = {}
_lock = threading.Lock()


def server_root(base_url: str) -> str:
    """The server's root from its OpenAI base URL (`http://h:8000/v1` -> `http://h:8000`)."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def _json(client: httpx2.Client, url: str) -> Any:
    """The JSON a GET answers with 200, else None (a refused connection raises: nothing to probe)."""
    try:
        response = client.get(url)
    except httpx2.TimeoutException:
        return None
    if response.status_code != 200:
        return None
    try:
        return response.json()
    except ValueError:
        return None


def detect(base_url: str, *, api_key: str | None = None, timeout: float = PROBE_TIMEOUT) -> tuple[str, str]:
    """(dialect, the evidence) for the server at `base_url`, asked once per URL per process."""
    with _lock:
        known = _found.get(base_url)
    if known is not None:
        return known
    found = _probe(base_url, api_key, timeout)
    with _lock:
        _found[base_url] = found
    return found


def forget() -> None:
    """Forget every server asked about: the next `detect` asks again. A process that starts servers on
    ports the system hands out (tests) may meet another kind of server at a URL it asked about before."""
    with _lock:
        _found.clear()


def _probe(base_url: str, api_key: str | None, timeout: float) -> tuple[str, str]:
    host = httpx2.URL(base_url).host
    if host == "api.openai.com":
        return "openai", f"host {host}"
    root = server_root(base_url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with httpx2.Client(timeout=timeout, headers=headers, trust_env=False) as client:
            props = _json(client, f"{root}/props")
            if isinstance(props, dict) and ("default_generation_settings" in props or "total_slots" in props):
                return "llamacpp", "GET /props answered (llama.cpp's server)"
            models = _json(client, f"{root}/v1/models")
            data = models.get("data") if isinstance(models, dict) else None
            if isinstance(data, list) and data and all(isinstance(m, dict) and m.get("owned_by") == "me"
                                                       and "permissions" in m for m in data):
                return "llamacpp", "GET /v1/models lists models owned_by 'me' (llama-cpp-python's server)"
            version = _json(client, f"{root}/api/version")
            if isinstance(version, dict) and "version" in version:
                return "ollama", "GET /api/version answered (Ollama)"
            for route in ("/api/v1/models", "/api/v0/models"):
                if isinstance(_json(client, f"{root}{route}"), dict):
                    return "lmstudio", f"GET {route} answered (LM Studio)"
            info = _json(client, f"{root}/info")
            if isinstance(info, dict) and "model_id" in info:
                return "tgi", "GET /info answered with model_id (TGI)"
            for route in ("/get_server_info", "/server_info"):
                if isinstance(_json(client, f"{root}{route}"), dict):
                    return "sglang", f"GET {route} answered (SGLang)"
            version = _json(client, f"{root}/version")
            if isinstance(version, dict) and "version" in version:
                return "vllm", "GET /version answered (vLLM)"
    except httpx2.HTTPError as exc:
        raise DialectError(f"model.server auto: cannot reach {root} to ask which server it is "
                           f"({type(exc).__name__}: {exc}); start it, or set model.server") from None
    raise DialectError(f"model.server auto: {root} answers none of the routes that tell a server "
                       "(llama.cpp /props, Ollama /api/version, LM Studio /api/v1/models, TGI /info, SGLang "
                       "/get_server_info, vLLM /version): set model.server to the server it is")


__all__ = ["PROBE_TIMEOUT", "detect", "forget", "server_root"]
