"""deploy/kubernetes/: every manifest parses, and the example holds together with the gateway's
defaults — a config that builds, probes on /healthz at the gateway's port, a grace period that
covers the drain, the Secret's keys for every template, several replicas on Redis and
PostgreSQL, the Containerfile's user and paths."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

from tests.deploy.support import DEPLOY, UNIT, drain_secs, parse_unit
from twengine.config import Config, build_config

MANIFESTS = sorted((DEPLOY / "kubernetes").glob("*.yaml"))


def _documents() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in MANIFESTS:
        for doc in YAML(typ="safe").load_all(path.read_text(encoding="utf-8")):
            assert isinstance(doc, dict), path
            assert {"apiVersion", "kind", "metadata"} <= doc.keys(), path
            docs.append(doc)
    return docs


def _one(kind: str) -> dict[str, Any]:
    (doc,) = [d for d in _documents() if d["kind"] == kind]
    return doc


def _container() -> dict[str, Any]:
    (container,) = _one("Deployment")["spec"]["template"]["spec"]["containers"]
    return container


def _secret_values() -> dict[str, str]:
    return dict(_one("Secret")["stringData"])


def _config_text() -> str:
    return str(_one("ConfigMap")["data"]["config.yaml"])


def _config() -> Config:
    return build_config(YAML(typ="safe").load(_config_text()), _secret_values())


def test_every_manifest_parses_and_the_kinds_are_there() -> None:
    assert MANIFESTS, "no manifests"
    kinds = sorted(d["kind"] for d in _documents())
    assert kinds == ["ConfigMap", "Deployment", "PodDisruptionBudget", "Secret", "Service"]


def test_the_config_builds_and_shares_state_through_redis_and_postgres() -> None:
    config = _config()
    assert config.state is not None and config.state.redis_url
    assert config.store is not None and config.store.postgres_dsn
    assert config.listen.gateway.bind == "0.0.0.0"
    assert _one("Deployment")["spec"]["replicas"] >= 2


def test_every_template_is_a_key_of_the_secret_the_pods_read() -> None:
    names = set(re.findall(r"\$\{([A-Z0-9_]+)\}", _config_text()))
    assert names and names <= _secret_values().keys(), names - _secret_values().keys()
    refs = [e["secretRef"]["name"] for e in _container()["envFrom"]]
    assert refs == [_one("Secret")["metadata"]["name"]]


def _port_number(name_or_number: str | int) -> int:
    if isinstance(name_or_number, int):
        return name_or_number
    (port,) = [p for p in _container()["ports"] if p["name"] == name_or_number]
    return int(port["containerPort"])


def test_probes_ask_healthz_on_the_gateway_port() -> None:
    port = _config().listen.gateway.port
    for probe in ("readinessProbe", "livenessProbe"):
        get = _container()[probe]["httpGet"]
        assert get["path"] == "/healthz", probe
        assert _port_number(get["port"]) == port, probe
    (service_port,) = _one("Service")["spec"]["ports"]
    assert _port_number(service_port["targetPort"]) == port


def test_the_grace_period_covers_the_drain_as_the_unit_does() -> None:
    pod = _one("Deployment")["spec"]["template"]["spec"]
    grace = pod["terminationGracePeriodSeconds"]
    command = _container()["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    pre_stop = float(command[1])
    # The preStop pause runs before SIGTERM; then the drain, then the store's last batch.
    assert grace >= pre_stop + drain_secs() + 10, (grace, pre_stop, drain_secs())
    unit_stop = float(parse_unit(UNIT)["Service"]["TimeoutStopSec"][-1])
    assert grace == unit_stop


def test_pods_run_as_the_image_user_with_its_paths() -> None:
    pod = _one("Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    containerfile = (Path(__file__).parents[2] / "Containerfile").read_text(encoding="utf-8")
    (user,) = re.findall(r"^USER (\d+):\d+$", containerfile, re.M)
    assert pod["securityContext"]["runAsUser"] == int(user)
    container = _container()
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/etc/twserve"]["readOnly"] is True
    assert "/data" in mounts  # the image's --data-dir; writable
    assert '--data-dir", "/data"' in containerfile
