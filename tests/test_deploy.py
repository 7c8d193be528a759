"""deploy/: the Kubernetes manifests validate against a pinned Kubernetes, and wire the plugin's variables."""

from __future__ import annotations

import json
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tabletune.acceptance import AcceptanceProfile
from tabletune.integrations.vllm.controller_hook import PROFILE_ENV, TABLE_FILE_ENV
from tabletune.integrations.vllm.metrics import METRICS_DIR_ENV
from tabletune.profile import StepProfile
from tabletune.table import DraftTable

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
KUBERNETES_VERSION = "1.33.0"
PLUGIN_ENV = (PROFILE_ENV, TABLE_FILE_ENV, METRICS_DIR_ENV)


def documents() -> list[dict]:
    docs = []
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def by_kind(kind: str) -> list[dict]:
    return [d for d in documents() if d["kind"] == kind]


@pytest.mark.parametrize("doc", [d for d in documents() if not d["apiVersion"].startswith("monitoring.coreos.com")],
                         ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_core_resources_validate_strictly(doc):
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_validator_rejects_a_broken_manifest():
    broken = json.loads(json.dumps(by_kind("Deployment")[0]))
    broken["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []  # typo of volumeMounts
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def check_pod(containers: list[dict], volumes: list[dict]) -> None:
    """Every plugin variable set, each path under a mounted volume, every volume defined."""
    configmaps = {d["metadata"]["name"] for d in by_kind("ConfigMap")}
    vllm = containers[0]
    env = {e["name"]: e["value"] for e in vllm["env"]}
    assert set(PLUGIN_ENV) <= set(env)
    mounts = {m["mountPath"]: m["name"] for m in vllm["volumeMounts"]}
    named = {v["name"]: v for v in volumes}
    for name in PLUGIN_ENV:
        mount = next(p for p in mounts if env[name] == p or env[name].startswith(p + "/"))
        volume = named[mounts[mount]]
        if "configMap" in volume:
            assert volume["configMap"]["name"] in configmaps
    assert named[mounts[env[TABLE_FILE_ENV].rsplit("/", 1)[0]]]["configMap"].get("optional") is True


def test_deployment_wires_the_plugin():
    pod = by_kind("Deployment")[0]["spec"]["template"]["spec"]
    check_pod(pod["containers"], pod["volumes"])
    assert "/etc/tabletune/profile/speculative_config.json" in pod["containers"][0]["args"][0]


def test_profile_configmap_is_a_loadable_tune_folder(tmp_path):
    data = next(d for d in by_kind("ConfigMap") if d["metadata"]["name"] == "tabletune-profile")["data"]
    for name, text in data.items():
        (tmp_path / name).write_text(text)
    assert StepProfile.load(tmp_path / "step_profile.json").ks
    assert AcceptanceProfile.load(tmp_path / "acceptance.json").entries
    spec = json.loads(data["speculative_config.json"])
    DraftTable.from_ranges(spec["num_speculative_tokens_per_batch_size"], spec["num_speculative_tokens"])


def test_servicemonitor_selects_the_service_port():
    monitor, service = by_kind("ServiceMonitor")[0], by_kind("Service")[0]
    labels = service["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    ports = {p["name"] for p in service["spec"]["ports"]}
    assert all(e["port"] in ports and e["path"] == "/metrics" for e in monitor["spec"]["endpoints"])


def test_llm_d_values_wire_the_plugin_into_decode_pods():
    values = yaml.safe_load((DEPLOY / "llm-d" / "values.yaml").read_text())
    decode = values["decode"]
    chart_only = ("modelCommand", "mountModelVolume")  # modelservice keys, not Kubernetes fields
    containers = [{k: v for k, v in c.items() if k not in chart_only} for c in decode["containers"]]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "decode"},
           "spec": {"containers": containers, "volumes": decode["volumes"]}}
    kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)
    check_pod(containers, decode["volumes"])
    port_names = {p["name"] for p in containers[0]["ports"]}
    monitor = decode["monitoring"]["podmonitor"]
    assert monitor["enabled"] and monitor["portName"] in port_names
