"""Which server and model a bundle's model calls go to, and with which key: `model_client(bundle)`.

    client = model_client(bundle)                          # model.base_url, model.name, model.api_key_env
    client = model_client(bundle, "http://127.0.0.1:8000")  # a `local` bundle: the embedded server there

A bundle names its model by `model.base_url` and `model.name`; `local` means the embedded model server, found
at the URL given, else `SA_LOCAL_MODEL_URL`, else the one a running `sa up` started (`runtime.running`). The
key is read from the environment variable `model.api_key_env` names, so no secret is written in a bundle.

`server_dialect(bundle, url)` is the request dialect its server speaks (`model.server`, or asked once for
`auto`), which decides the fields a constraint is sent in (`runtime.model.dialects`).

Why here, beside `ModelClient`: the host, the worker and `Agent` in one process each build the client of a
bundle's model, and the host and the worker must not import `Agent` (a floor above them) to do it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from runtime.model.client import ModelClient
from runtime.quantities import parse_duration
from runtime.running import running_model_url

if TYPE_CHECKING:
    from runtime.bundle import Bundle


def model_client(bundle: Bundle, model_url: str | None = None, *, api_key: str | None = None) -> ModelClient:
    """The client for a bundle's model: `model.base_url`, or for `local` the embedded model server at
    `model_url` (else `SA_LOCAL_MODEL_URL`). The key comes from `model.api_key_env` when the bundle names
    one. Shared by `Agent`, the host and the worker (a tool's `ask_llm`), so all reach the same model the same
    way."""
    spec = bundle.spec.model
    if bundle.uses_local_model:
        url = model_url or os.environ.get("SA_LOCAL_MODEL_URL") or running_model_url()
        if not url:
            raise ValueError(f"bundle {bundle.name} uses the local model, but no local model server was "
                             "found: start `sa up` (it is found by itself) or `sa model serve`, and pass "
                             "its URL as model_url=... (or set SA_LOCAL_MODEL_URL)")
        base_url, model = url.rstrip("/") + ("" if url.rstrip("/").endswith("/v1") else "/v1"), "local"
    else:
        base_url, model = spec.base_url, spec.name
    key = os.environ.get(spec.api_key_env) if spec.api_key_env else api_key
    provider = spec.provider or ("structured-agents" if bundle.uses_local_model else None)
    return ModelClient(base_url=base_url, model=model, api_key=key, provider=provider,
                       timeout=parse_duration(spec.timeout, field="timeout") or 60.0)


def server_dialect(bundle: Bundle, base_url: str | None, *, api_key: str | None = None) -> str:
    """The request dialect of the bundle's server: `model.server`, or for `auto` the server's answer, asked
    once per URL (`runtime.model.detect`). The embedded model server (`local`) reads vLLM's fields."""
    from runtime.model.detect import detect

    spec = bundle.spec.model
    if spec.server != "auto":
        return spec.server
    if bundle.uses_local_model or base_url is None:
        return "vllm"
    key = os.environ.get(spec.api_key_env) if spec.api_key_env else api_key
    return detect(base_url, api_key=key)[0]


__all__ = ["model_client", "server_dialect"]
