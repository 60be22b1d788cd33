"""Built-in externals a bundle grants per tool: `ask_llm`, `http_request` and `secret`.

    - path: tools/order.pym
      grants:
        ask_llm: true                          # the bundle's model, through the same client
        http_request: {hosts: [api.example.com, 127.0.0.1]}
        secrets: [SHOP_TOKEN]                  # readable with secret("SHOP_TOKEN")

A script declares what it uses with `@external` as usual (`async def ask_llm(prompt: str, *,
temperature: float = 0.0) -> str`, `async def http_request(method: str, url: str, *, headers: dict | None
= None, body: str | None = None, json: Any = None, timeout: float = 10.0) -> dict`, `def secret(name:
str) -> str`); a grant is what makes the worker provide it.

- `ask_llm` answers with the bundle's model. Each call is recorded in the run's events as a printed
  line of the script run (`ask_llm #n: ...`, a `script.printed` in `sa replay`) shipped in the job's
  outcome, so the log shows what the tool asked and was told; like every external, its answer is
  recorded for redelivery (`record`).
- `http_request` reaches only the hosts granted to the tool: any other host is an error naming the
  allow-list, raised before a connection is made. Redirects are not followed (they could leave the list).
- `secret` reads a granted name from the worker's secrets file (`sa worker --secrets FILE`, `NAME=value`
  lines) or else its environment. Secret values are never recorded: `secret` is re-run on redelivery
  instead of stored, and `Secrets.redact` scrubs every granted value from what a job sends back (the
  output, printed lines, error messages) before it leaves the worker.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import msgspec

if TYPE_CHECKING:
    from runtime.model.client import ModelClient

__all__ = ["BUILTINS", "Grants", "Secrets", "builtin_externals", "redact_value"]

BUILTINS = ("ask_llm", "http_request", "secret")
MAX_RECORDED_TEXT = 2000  # characters of a prompt or an answer kept in the printed line


@dataclass(frozen=True)
class Grants:
    """What a bundle lets one tool use: the model, HTTP to some hosts, some secrets."""

    ask_llm: bool = False
    http_hosts: tuple[str, ...] = ()
    http: bool = False
    secrets: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        """The built-in externals these grants provide."""
        return tuple(n for n, on in (("ask_llm", self.ask_llm), ("http_request", self.http),
                                     ("secret", bool(self.secrets))) if on)


@dataclass
class Secrets:
    """Secret values by name: a `NAME=value` file first, then the environment. Never logged."""

    file: Path | None = None
    _values: dict[str, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.file is not None:
            for line in Path(self.file).read_text(encoding="utf-8").splitlines():
                line = line.strip()
                if line and not line.startswith("#") and "=" in line:
                    key, _, value = line.partition("=")
                    self._values[key.strip()] = value.strip()

    def get(self, name: str) -> str | None:
        return self._values.get(name, os.environ.get(name))

    def values(self, names: Iterable[str]) -> list[str]:
        """The values of `names` that exist, longest first (a value inside another is scrubbed whole)."""
        found = [v for n in names if (v := self.get(n))]
        return sorted(found, key=len, reverse=True)


def redact_value(value: Any, secrets: list[str]) -> Any:
    """`value` with every occurrence of each secret in its strings replaced by `[secret]`."""
    if not secrets:
        return value
    if isinstance(value, str):
        for s in secrets:
            value = value.replace(s, "[secret]")
        return value
    if isinstance(value, dict):
        return {redact_value(k, secrets): redact_value(v, secrets) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_value(v, secrets) for v in value)
    return value


def builtin_externals(grants: Grants, *, tool: str, model: Callable[[], ModelClient] | None,
                      sampling: dict[str, Any], secrets: Secrets,
                      printed: Callable[[str], None]) -> dict[str, Callable[..., Any]]:
    """The granted built-ins for one call of `tool`; `printed` receives the line recording each model call."""
    out: dict[str, Callable[..., Any]] = {}
    if grants.ask_llm:
        asked = 0

        async def ask_llm(prompt: str, *, temperature: float = 0.0) -> str:
            nonlocal asked
            if model is None:
                raise RuntimeError(f"tool {tool!r} was granted ask_llm but its bundle's model is not known "
                                   "to this worker: serve the tool with `sa worker --bundle`")
            asked += 1
            client = model()
            reply = await client.complete([{"role": "user", "content": prompt}], temperature=temperature,
                                          max_tokens=sampling.get("max_tokens"))
            printed(f"ask_llm #{asked} ({reply.usage.prompt_tokens}+{reply.usage.completion_tokens} tokens, "
                    f"{reply.latency_ms:.0f} ms): {prompt[:MAX_RECORDED_TEXT]!r} -> "
                    f"{reply.text[:MAX_RECORDED_TEXT]!r}")
            return reply.text

        out["ask_llm"] = ask_llm
    if grants.http:
        allowed = tuple(h.lower() for h in grants.http_hosts)

        async def http_request(method: str, url: str, *, headers: dict[str, str] | None = None,
                               body: str | None = None, json: Any = None,
                               timeout: float = 10.0) -> dict[str, Any]:
            import httpx

            host = (urlsplit(url).hostname or "").lower()
            if urlsplit(url).scheme not in ("http", "https"):
                raise ValueError(f"http_request: {url!r} is not an http(s) URL")
            if host not in allowed:
                raise PermissionError(f"http_request: host {host!r} is not allowed for tool {tool!r}; "
                                      f"allowed: {', '.join(allowed) or 'none'} (grants.http_request.hosts)")
            content = msgspec.json.encode(json) if json is not None else body
            hdrs = dict(headers or {})
            if json is not None:
                hdrs.setdefault("content-type", "application/json")
            async with httpx.AsyncClient(timeout=timeout, follow_redirects=False) as client:
                resp = await client.request(method.upper(), url, headers=hdrs, content=content)
            result: dict[str, Any] = {"status": resp.status_code, "text": resp.text,
                                      "headers": dict(resp.headers)}
            try:
                result["json"] = resp.json()
            except ValueError:
                result["json"] = None
            return result

        out["http_request"] = http_request
    if grants.secrets:
        granted = frozenset(grants.secrets)

        def secret(name: str) -> str:
            if name not in granted:
                raise PermissionError(f"secret {name!r} is not granted to tool {tool!r}; granted: "
                                      f"{', '.join(sorted(granted))} (grants.secrets in the bundle)")
            value = secrets.get(name)
            if value is None:
                raise KeyError(f"secret {name!r} is not set on this worker: put it in the worker's "
                               "environment or its --secrets file")
            return value

        out["secret"] = secret
    return out
