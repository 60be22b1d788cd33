"""The candidate of a regression: the bundle the recorded runs are driven again on, loaded and checked.

    candidate = await load_candidate("bundles/shop-next", "shop", cache)               # another version
    candidate = await load_candidate("bundles/shop", "shop", cache, system_prompt="Be brief.")
    candidate = await load_candidate("bundles/shop", "shop", cache, base_url="http://gpu2:8000/v1",
                                     model="qwen3")                                    # another model

Either another bundle folder of the same agent, or a bundle with overrides of its system prompt and its model
endpoint (URL and model name). Its model calls go to its model (that is the point of a regression), through a
`CachedModelClient` so the same request is never asked twice. A candidate that does not load, names another
agent or has a decoding constraint its server cannot enforce is a `RegressError` here, before any run starts.

`id` names the candidate in each regression run's `run.started` (`RegressionOf.candidate`): the bundle's
digest, and a hash of the overrides when there are any, so two candidates that differ only by an override are
told apart.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.bundle import Bundle, BundleError, load_bundle
from runtime.model import ModelStep, get_adapter
from runtime.model.connect import model_client, server_dialect
from runtime.model.limits import LocalGate
from runtime.regress.cache import CachedModelClient, ModelCache
from runtime.regress.sets import RegressError


@dataclass
class Candidate:
    """A loaded candidate: its bundle (overrides applied), its cached model client, its model step."""

    bundle: Bundle
    client: CachedModelClient
    step: ModelStep
    id: str
    overrides: dict[str, Any]

    async def aclose(self) -> None:
        await self.client.aclose()


async def load_candidate(path: str | Path, agent: str, cache: ModelCache, *, system_prompt: str | None = None,
                   base_url: str | None = None, model: str | None = None,
                   model_url: str | None = None) -> Candidate:
    """Load the candidate at `path` for `agent`'s runs (see the module docstring). `model_url` is where a
    `base_url: local` bundle's embedded model server is (as for `Agent`)."""
    try:
        bundle = load_bundle(path)
    except (BundleError, OSError) as e:
        raise RegressError(f"the candidate bundle at {path} does not load: {e}") from None
    if bundle.name != agent:
        raise RegressError(f"the candidate bundle at {path} defines agent {bundle.name!r}, but the runs are "
                           f"{agent!r}'s: a candidate is a version of the same agent")
    overrides = {k: v for k, v in (("system_prompt", system_prompt), ("base_url", base_url),
                                   ("model", model)) if v is not None}
    if system_prompt is not None:
        bundle = dataclasses.replace(bundle, system_prompt=system_prompt)
    settings: dict[str, Any] = {"base_url": base_url, "model": model, "timeout": 120.0}
    if base_url is None:  # the bundle's own endpoint, found as `Agent` finds it (`local`: the embedded one)
        try:
            plain = model_client(bundle, model_url)
        except ValueError as e:
            raise RegressError(f"the candidate's model cannot be reached: {e}") from None
        settings.update(base_url=plain.base_url, model=model or plain.model, api_key=plain._client.api_key,
                        provider=plain.provider, timeout=plain.timeout)
        await plain.aclose()
    client = CachedModelClient(cache, **settings)
    _within_endpoint(bundle, client)
    try:
        dialect = server_dialect(bundle, client.base_url)
        step = ModelStep.for_config(get_adapter(bundle.spec.model.adapter), bundle.kernel_config(),
                                    bundle.decoding_constraint(), dialect=dialect)
    except Exception as e:  # an unknown dialect, a constraint the server cannot enforce
        await client.aclose()
        raise RegressError(f"the candidate bundle at {path} cannot call its model: {e}") from None
    ident = bundle.digest
    if overrides:
        ident += "+" + hashlib.sha256(json.dumps(overrides, sort_keys=True).encode()).hexdigest()[:8]
    return Candidate(bundle, client, step, ident, overrides)


def _within_endpoint(bundle: Bundle, client: CachedModelClient) -> None:
    """The bundle's `endpoint:` in this process, as `Agent` applies it: its retry settings, and a gate of
    `max_in_flight` permits (and `tokens_per_minute`) over this regression's calls. The fleet's hosts hold
    their own share; a regression never takes more than the endpoint's whole share from here."""
    limits = bundle.endpoint
    if limits is None:
        return
    client.retry.retry_after_max = limits.retry_after_max
    client.retry.throttle_retries = limits.throttle_retries
    if limits.limited:
        client.limiter = LocalGate(limits.max_in_flight or 10**9, tokens_per_minute=limits.tokens_per_minute)


__all__ = ["Candidate", "load_candidate"]
