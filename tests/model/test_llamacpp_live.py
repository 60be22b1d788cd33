"""A real llama.cpp server (llama-cpp-python's, built from source by `make llamacpp`) running the shipped
SmolLM2 weights: `model.server: auto` finds it, the constraint goes in the fields it enforces, and every
call the model writes is valid, for the demo bundle and a four-tool bundle; the strategies it cannot
enforce are refused at load with a message naming what it can.

Only with `--live-servers` (`make llamacpp`, which CI runs after `make test`): the server runs the model
on one CPU thread, a minute or two in all. What the translation is worth (the same bundles sent vLLM's
fields, which llama.cpp ignores) is measured by bench/servers.py, not asserted: how often an
unconstrained 135M model errs is the model's business, not a property of this code.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.bundle import BundleError, load_bundle
from testbed.llamacpp import (
    SHIPPED_DEMO,
    TASKS,
    LlamaServer,
    llamacpp_python,
    notes_bundle,
    run_tasks,
    variant,
)

pytestmark = [pytest.mark.live_server, pytest.mark.anyio]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    python = llamacpp_python()
    if python is None:
        pytest.fail("no llama.cpp environment: `make llamacpp` builds .venv-llamacpp "
                    "(or set SA_LLAMACPP_PYTHON)")
    with LlamaServer(python, log=tmp_path_factory.mktemp("llamacpp") / "server.log") as running:
        yield running


async def test_the_demo_on_llama_cpp_writes_only_valid_calls(server: LlamaServer, tmp_path: Path) -> None:
    bundle = variant(SHIPPED_DEMO, tmp_path, server.base_url, server="auto", strategy="json_schema")
    tally = await run_tasks(bundle, TASKS["demo"])
    assert tally.dialects == {"llamacpp"}  # `auto` asked the server, and every request says what it spoke
    assert tally.unconstrained == 0
    # every finished reply is a valid call (a reply cut at max_tokens is counted apart: see `Tally`)
    assert tally.replies >= len(TASKS["demo"]) and tally.invalid == 0, tally.bad
    assert tally.valid > tally.cut and tally.completed >= 1, tally


async def test_a_four_tool_bundle_on_llama_cpp_writes_only_valid_calls(server: LlamaServer,
                                                                       tmp_path: Path) -> None:
    bundle = notes_bundle(tmp_path, server.base_url, server="llamacpp", strategy="json_schema")
    tally = await run_tasks(bundle, TASKS["notes"])
    assert tally.dialects == {"llamacpp"} and tally.unconstrained == 0
    assert tally.replies >= len(TASKS["notes"]) and tally.invalid == 0, tally.bad
    assert tally.valid > tally.cut, tally


@pytest.mark.parametrize("strategy", ["ebnf", "structural_tag"])
def test_what_llama_cpp_cannot_enforce_is_refused_at_load(server: LlamaServer, tmp_path: Path,
                                                          strategy: str) -> None:
    bundle = variant(SHIPPED_DEMO, tmp_path, server.base_url, server="llamacpp", strategy=strategy)
    with pytest.raises(BundleError) as err:
        load_bundle(bundle)
    why = dict(err.value.problems)["model.server"]
    assert f"llama.cpp cannot enforce strategy {strategy}" in why and "json_schema" in why, why
