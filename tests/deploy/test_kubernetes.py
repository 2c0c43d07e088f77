"""The manifests of deploy/kubernetes/: valid against the Kubernetes 1.30 schema (strict: no
unknown field), listed by the kustomization, and consistent with one another and the program
(commands, settings, selectors, ports, probes)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from periodic_manager.cli.main import _parser
from periodic_manager.settings import Settings
from tests.support import ROOT

KUBE = ROOT / "deploy" / "kubernetes"
VERSION = "1.30.0"
NOT_IN_THE_SCHEMA = {"Kustomization", "ServiceMonitor"}  # kustomize's and a CRD: checked below
KUSTOMIZATION = yaml.safe_load((KUBE / "kustomization.yaml").read_text())
FILES = sorted(p for p in KUBE.glob("*.yaml") if p.name != "kustomization.yaml")


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


ALL = [d for p in FILES for d in docs(p)]


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [d for d in ALL if d["kind"] == kind]


def named(kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in of_kind(kind) if d["metadata"]["name"] == name]
    return found


def pod_specs() -> list[dict[str, Any]]:
    return [d["spec"]["template"]["spec"] for d in ALL if d["kind"] in ("Deployment", "Job")]


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_the_manifest_is_valid_against_the_schema_strictly(path: Path) -> None:
    for doc in docs(path):
        if doc["kind"] not in NOT_IN_THE_SCHEMA:
            kubernetes_validate.validate(doc, VERSION, strict=True)


def test_strict_validation_refuses_an_unknown_field() -> None:
    broken = copy.deepcopy(named("Deployment", "periodic-manager"))
    broken["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSION, strict=True)


def test_the_kustomization_lists_every_manifest_and_names_the_image() -> None:
    assert sorted(KUSTOMIZATION["resources"]) == [p.name for p in FILES]
    (image,) = KUSTOMIZATION["images"]
    containers = [c for spec in pod_specs() for c in spec["containers"]]
    assert containers and {c["image"] for c in containers} == {image["name"]}


def test_every_container_runs_a_command_of_the_program_with_settings_it_has() -> None:
    parser = _parser()
    config = named("ConfigMap", "periodic-manager")["data"]
    secret = named("Secret", "periodic-manager")["stringData"]
    for key in [*config, *secret]:
        assert key.removeprefix("PM_").lower() in Settings.model_fields, key
    for spec in pod_specs():
        assert spec["securityContext"]["runAsNonRoot"] is True
        for container in spec["containers"]:
            parser.parse_args(container["args"])
            for env in container.get("env", []):
                assert env["name"].removeprefix("PM_").lower() in Settings.model_fields
            for source in container["envFrom"]:
                ref = source.get("configMapRef") or source["secretRef"]
                kind = "ConfigMap" if "configMapRef" in source else "Secret"
                named(kind, ref["name"])
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                command = container.get(probe, {}).get("exec", {}).get("command")
                if command:
                    assert command[0] == "periodic-manager"
                    parser.parse_args(command[1:])
            assert container["resources"]["requests"]["memory"]


def test_three_managers_probed_by_their_file_given_time_to_hand_over() -> None:
    manager = named("Deployment", "periodic-manager")
    spec = manager["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert manager["spec"]["replicas"] == 3 and container["args"] == ["manager"]
    probe_dir = {e["name"]: e["value"] for e in container["env"]}["PM_PROBE_DIR"]
    assert probe_dir in {m["mountPath"] for m in container["volumeMounts"]}
    for probe in ("startupProbe", "livenessProbe"):  # Ready once the probe file is written
        assert "health" in container[probe]["exec"]["command"]
    assert manager["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert spec["terminationGracePeriodSeconds"] > Settings.model_fields["lease_ttl"].default
    pdb = named("PodDisruptionBudget", "periodic-manager")
    assert pdb["spec"]["selector"]["matchLabels"] == manager["spec"]["selector"]["matchLabels"]


def test_the_api_is_its_own_deployment_and_service_with_its_probes() -> None:
    api = named("Deployment", "periodic-manager-api")
    (container,) = api["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["api"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    job = named("Job", "periodic-manager-migrate-0-1-0")["spec"]["template"]["spec"]
    assert job["containers"][0]["args"] == ["migrate"]


def test_services_and_the_service_monitor_select_what_exists() -> None:
    pods = {
        d["metadata"]["name"]: (
            d["spec"]["template"]["metadata"]["labels"],
            {p["name"] for c in d["spec"]["template"]["spec"]["containers"] for p in c["ports"]},
        )
        for d in of_kind("Deployment")
    }
    ports_by_service = {}
    for service in of_kind("Service"):
        selector = service["spec"]["selector"]
        matched = [ports for labels, ports in pods.values() if selector.items() <= labels.items()]
        assert len(matched) == 1, service["metadata"]["name"]
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in matched[0]
        ports_by_service[service["metadata"]["name"]] = service
    (monitor,) = of_kind("ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    wanted = monitor["spec"]["selector"]["matchLabels"]
    selected = [
        s for s in ports_by_service.values() if wanted.items() <= s["metadata"]["labels"].items()
    ]
    served = {p["name"] for s in selected for p in s["spec"]["ports"]}
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= served
    for endpoint in monitor["spec"]["endpoints"]:
        credentials = endpoint.get("authorization", {}).get("credentials")
        if credentials:
            assert credentials["key"] in named("Secret", credentials["name"])["stringData"]
