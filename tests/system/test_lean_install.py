"""A host+worker install without the `model` extra: `sa host`, `sa worker` and `sa send` import and run a
task end to end with torch, transformers, gguf, safetensors and xgrammar unimportable, and the commands that
need them say how to install the extra instead of failing inside an import.

"Unimportable" is real, not simulated by stubs: every `sa` process here starts with a `sitecustomize` module
(first on PYTHONPATH) that puts a meta-path finder in front of all others, which raises ImportError for those
packages, as a Python without them installed would. Real nats-server, real Monty, the scripted model server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from host_helpers import calc_responder, write_bundle

from runtime import events as ev
from runtime import nats as bus
from runtime.log import RunLog
from runtime.testing import ScriptedModelServer
from testbed.fleet import CLI, SaProcess, start_all

pytestmark = pytest.mark.anyio

BLOCKED = ("torch", "transformers", "gguf", "safetensors", "xgrammar", "triton")
HINT = "pip install 'structured-agents[model]'"

SITECUSTOMIZE = f'''\
import sys

BLOCKED = {BLOCKED!r}


class _NotInstalled:
    """As if the model extra were not installed: importing one of its packages fails."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by the lean-install test)",
                                      name=name)
        return None


sys.meta_path.insert(0, _NotInstalled())
'''


@pytest.fixture
def lean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """PYTHONPATH that makes every `sa` child process start without the model extra's packages."""
    site = tmp_path / "lean-site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    path = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")]),
                            str(Path(__file__).parents[2])])
    monkeypatch.setenv("PYTHONPATH", path)  # SaProcess passes os.environ on
    return {**os.environ, "PYTHONPATH": path}


def sa(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def test_the_blocker_really_blocks(lean_env):
    """The premise of every other test here: in these processes the model extra cannot be imported."""
    for name in BLOCKED:
        probe = subprocess.run([sys.executable, "-c", f"import {name}"], env=lean_env, capture_output=True,
                               text=True, timeout=60)
        assert probe.returncode == 1, name
        assert f"No module named '{name}' (blocked" in probe.stderr


def test_host_worker_and_cli_modules_import_without_the_model_extra(lean_env):
    code = (
        "import sys\n"
        "import runtime, runtime.cli, runtime.host, runtime.worker, runtime.commands, runtime.log\n"
        "import runtime.model.client, runtime.model.constraints, runtime.client.status\n"
        "from runtime.extras import missing\n"
        f"loaded = sorted(m for m in sys.modules if m.partition('.')[0] in {BLOCKED!r})\n"
        "print('loaded:', loaded, 'missing:', missing('model'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=lean_env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ("loaded: [] missing: "
                                  "['torch', 'transformers', 'gguf', 'safetensors', 'xgrammar']")


def test_model_serve_says_how_to_install_the_extra(lean_env):
    out = sa(lean_env, "model", "serve", "--port", "0")
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert "sa model serve needs the 'model' extra" in out.stderr
    assert "torch" in out.stderr and HINT in out.stderr
    assert "Traceback" not in out.stderr


def test_up_with_a_local_model_bundle_says_how_before_starting_anything(lean_env, tmp_path):
    bundle = write_bundle(tmp_path, "loc", base_url="local")
    store = tmp_path / "store"
    out = sa(lean_env, "up", str(bundle), "--store", str(store))
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert "sa up with a bundle on the local model needs the 'model' extra" in out.stderr
    assert HINT in out.stderr
    assert not store.exists()  # no NATS was started, nothing was written


def test_ebnf_bundle_on_a_lean_host_names_the_extra(lean_env, tmp_path, nats_server):
    bundle = write_bundle(tmp_path, "calc")  # strategy: ebnf, whose grammar xgrammar derives
    out = sa({**lean_env, "NATS_URL": nats_server.url}, "host", str(bundle))
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "deriving the grammar of the ebnf strategy" in out.stderr and HINT in out.stderr


async def test_a_task_runs_end_to_end_on_a_lean_host_and_worker(lean_env, tmp_path, nats_server):
    """`sa host` + `sa worker` + `sa send --follow`, none of them able to import torch & co: the structural
    tag strategy (built without xgrammar; the server compiles it) runs a calculator call to its answer."""
    url = nats_server.url
    nc = await bus.connect(url, name="lean-install")
    procs: list[SaProcess] = []
    try:
        js = nc.jetstream()
        with ScriptedModelServer(responder=calc_responder) as server:
            bundle = write_bundle(tmp_path, "lean", base_url=server.base_url)
            bundle.write_text(bundle.read_text().replace("strategy: ebnf", "strategy: structural_tag"))
            host = SaProcess("host", ["host", str(bundle)], url, tmp_path / "host.log", "sa host: serving")
            worker = SaProcess("worker", ["worker", "--bundle", str(bundle), "--concurrency", "2"], url,
                               tmp_path / "worker.log", "serving")
            procs = [host, worker]
            await anyio.to_thread.run_sync(start_all, procs)
            sent = await anyio.to_thread.run_sync(
                lambda: sa({**lean_env, "NATS_URL": url}, "send", "lean", "compute: 6 * 7", "--follow",
                           "--json", "--timeout", "60"))
            assert sent.returncode == 0, (sent.stdout, sent.stderr, (tmp_path / "host.log").read_text())
            run_id = json.loads(sent.stdout.splitlines()[0])["run_id"]
            with anyio.fail_after(30):
                log = await RunLog(js).read(run_id)
        structured = server.requests[0]["structured_outputs"]
    finally:
        for p in procs:
            p.stop()
        await bus.close(nc)

    assert "structural_tag" in structured
    completed = [e for e in log.events if isinstance(e, ev.RunCompleted)]
    assert len(completed) == 1 and "42" in str(completed[0].output)
    assert any(isinstance(e, ev.ScriptCompleted) and e.tool == "calculator"
               for e in ev.expand_all(log.events))  # the script run rides in its outcome
    for p in ("host.log", "worker.log"):
        assert "ModuleNotFoundError" not in (tmp_path / p).read_text()
