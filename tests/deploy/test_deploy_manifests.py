"""deploy/kubernetes and deploy/kserve: every tree renders with the real kubectl, and every object
validates offline against the Kubernetes schemas (kubernetes-validate, strict) and KServe's API
types (kserve_types); the pieces agree with each other and with coreserve's flags."""

from __future__ import annotations

import copy
from typing import Any

import kserve_types
import kubernetes_validate
import pytest
from deploy_render import DEPLOY, KUBERNETES, TREES, flag_values, load_yaml, one, render, server_container
from kube_schemas import validate_object, versions

KSERVE_EXAMPLE = DEPLOY / "kserve" / "inference-service-example.yaml"
KUBERNETES_TREES = ("cpu", "gpu")


@pytest.mark.parametrize("tree", TREES)
def test_every_tree_renders(tree: str) -> None:
    kinds = sorted(item["kind"] for item in render(TREES[tree]))
    if tree == "kserve":
        assert kinds == ["ClusterServingRuntime"]
    else:
        assert kinds == ["Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget", "Service"]


@pytest.mark.parametrize("version", versions())
@pytest.mark.parametrize("tree", KUBERNETES_TREES)
def test_kubernetes_objects_validate_strictly(tree: str, version: str) -> None:
    for manifest in render(TREES[tree]):
        validate_object(manifest, version)


def test_strict_validation_refuses_a_misspelt_field() -> None:
    deployment = copy.deepcopy(one(render(TREES["cpu"]), "Deployment"))
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError, match="readinesProbe"):
        validate_object(deployment, versions()[-1])


@pytest.mark.parametrize("version", versions())
def test_kserve_objects_validate_against_the_kserve_api_types(version: str) -> None:
    for manifest in [*render(TREES["kserve"]), load_yaml(KSERVE_EXAMPLE)]:
        assert kserve_types.errors(manifest, version) == [], manifest["kind"]


def test_the_kserve_check_refuses_mistakes() -> None:
    runtime = copy.deepcopy(one(render(TREES["kserve"]), "ClusterServingRuntime"))
    runtime["spec"]["protocolVersion"] = runtime["spec"].pop("protocolVersions")
    runtime["spec"]["supportedModelFormats"][0]["autoSelect"] = "no"
    runtime["spec"]["containers"][0]["imagePullPolicy"] = 3
    assert sorted(kserve_types.errors(runtime, versions()[-1])) == sorted(
        [
            "ClusterServingRuntime.spec: unknown field 'protocolVersion' (not in V1alpha1ServingRuntimeSpec)",
            "ClusterServingRuntime.spec.containers[0].imagePullPolicy: 3 is not of type 'string', 'null'",
            "ClusterServingRuntime.spec.supportedModelFormats[0].autoSelect: expected bool, got 'no'",
        ]
    )
    del runtime["spec"]["containers"]
    assert "ClusterServingRuntime.spec: missing required field 'containers'" in kserve_types.errors(
        runtime, versions()[-1]
    )


def test_the_kserve_runtime_serves_v2_from_mnt_models() -> None:
    runtime = one(render(TREES["kserve"]), "ClusterServingRuntime")
    container = server_container([runtime])
    flags = flag_values(container["args"])
    assert flags["--model-repository"] == "/mnt/models"
    # KServe sends HTTP to 8080 and grpc-v2 to 9000, as to its own Triton runtime.
    assert (flags["--http-port"], flags["--grpc-port"]) == ("8080", "9000")
    assert [port["containerPort"] for port in container["ports"]] == [8080]
    assert set(runtime["spec"]["protocolVersions"]) == {"v2", "grpc-v2"}
    assert runtime["spec"]["annotations"]["prometheus.kserve.io/port"] == flags["--metrics-port"]
    # The example InferenceService names this runtime and a format it declares.
    model = load_yaml(KSERVE_EXAMPLE)["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"] in [
        {"name": format["name"], "version": format["version"]}
        for format in runtime["spec"]["supportedModelFormats"]
    ]
    assert model["storageUri"].startswith("s3://")


@pytest.mark.parametrize("tree", KUBERNETES_TREES)
def test_selectors_find_the_pods(tree: str) -> None:
    objects = render(TREES[tree])
    deployment = one(objects, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    assert one(objects, "Service")["spec"]["selector"].items() <= pod_labels.items()
    assert one(objects, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"] == selector
    target = one(objects, "HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])


@pytest.mark.parametrize("tree", KUBERNETES_TREES)
def test_the_grace_period_covers_the_exit_timeout(tree: str) -> None:
    pod = one(render(TREES[tree]), "Deployment")["spec"]["template"]["spec"]
    container = server_container([{"kind": "Deployment", "spec": {"template": {"spec": pod}}}])
    exit_timeout = float(flag_values(container["args"])["--exit-timeout-secs"])
    sleep = container["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep[0] == "sleep"
    # SIGTERM comes after the preStop hook; the kubelet's SIGKILL comes at the grace period's end.
    assert pod["terminationGracePeriodSeconds"] >= float(sleep[1]) + exit_timeout + 5


@pytest.mark.parametrize("tree", KUBERNETES_TREES)
def test_probes_ask_tritons_endpoints_and_grpc_health(tree: str) -> None:
    container = server_container(render(TREES[tree]))
    flags = flag_values(container["args"])
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {
        "http": int(flags["--http-port"]),
        "grpc": int(flags["--grpc-port"]),
        "metrics": int(flags["--metrics-port"]),
    }
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert container["startupProbe"]["grpc"] == {"port": ports["grpc"]}
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600  # model loading time


def test_the_overlays_differ_only_where_a_gpu_needs_it() -> None:
    cpu, gpu = (server_container(render(TREES[tree])) for tree in KUBERNETES_TREES)
    assert cpu["args"] == gpu["args"] and cpu["env"] == gpu["env"]
    assert cpu["image"].endswith("-cpu") and gpu["image"].endswith("-gpu")
    assert "nvidia.com/gpu" not in cpu["resources"].get("limits", {})
    assert gpu["resources"]["limits"]["nvidia.com/gpu"] == 1
    gpu_pod = one(render(TREES["gpu"]), "Deployment")["spec"]["template"]["spec"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in gpu_pod["tolerations"]


@pytest.mark.parametrize("tree", KUBERNETES_TREES)
def test_the_autoscaler_scales_on_the_metric_the_adapter_rule_serves(tree: str) -> None:
    objects = render(TREES[tree])
    hpa = one(objects, "HorizontalPodAutoscaler")
    assert hpa["spec"]["minReplicas"] >= 2  # with the budget's maxUnavailable: 1, one always serves
    assert one(objects, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
    [metric] = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    name = metric["pods"]["metric"]["name"]
    [rule] = load_yaml(KUBERNETES / "prometheus-adapter-rules.yaml")["rules"]["custom"]
    assert rule["name"]["as"] == name and rule["seriesQuery"].startswith(f"{name}{{")
    # Prometheus scrapes the port coreserve serves metrics on (test_deploy_serves reads the metric there).
    annotations: dict[str, Any] = one(objects, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    args = flag_values(server_container(objects)["args"])
    assert annotations["prometheus.io/port"] == args["--metrics-port"]
