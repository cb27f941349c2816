"""deploy/helm/coreserve: `helm lint --strict` passes and `helm template` renders the defaults and
every deploy/helm/examples/*.yaml (Helm's own Go SDK, through helm-python-sdk); every object
validates offline as test_deploy_manifests validates the Kustomize trees (Kubernetes schemas of
the oldest and newest versions, KServe's API types, and a schema of ours for the ServiceMonitor);
the chart renders what the Kustomize base and deploy/kserve render where they mean the same; and
values.schema.json and the templates refuse bad values with a message that names them."""

from __future__ import annotations

import copy
import re
from typing import Any

import kserve_types
import monitoring_types
import pytest
import yaml
from deploy_render import DEPLOY, TREES, Manifest, flag_values, one, server_container
from deploy_render import render as kustomize
from helm_render import CHART, NAMESPACE, VALUES_FILES, lint, refusal, render, render_values, values_of
from kube_schemas import validate_object, versions

# The kinds the chart renders by values file.
SERVER_KINDS = ["Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget", "Service"]
KINDS = {
    "defaults": SERVER_KINDS,
    "cpu": SERVER_KINDS,
    "gpu": SERVER_KINDS,
    "s3": SERVER_KINDS,
    "gcs": sorted([*SERVER_KINDS, "ServiceAccount"]),
    "azure": SERVER_KINDS,
    "kserve": ["ClusterServingRuntime"],
    "servicemonitor": sorted([*SERVER_KINDS, "ServiceMonitor"]),
}
# Which values file renders what a Kustomize tree renders.
SAME_AS_KUSTOMIZE = {"defaults": "cpu", "cpu": "cpu", "gpu": "gpu"}
WITH_SERVER = [name for name in VALUES_FILES if "Deployment" in KINDS[name]]


def pod_spec(objects: list[Manifest]) -> Manifest:
    spec: Manifest = one(objects, "Deployment")["spec"]["template"]["spec"]
    return spec


def env_of(container: Manifest) -> dict[str, Any]:
    """The container's environment, name → value or valueFrom."""
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container.get("env", [])}


def test_every_values_file_is_tested() -> None:
    assert sorted(KINDS) == sorted(VALUES_FILES)


@pytest.mark.parametrize("kube_version", [f"v{version}.0" for version in versions()])
@pytest.mark.parametrize("values", VALUES_FILES)
def test_helm_lint_strict_passes(values: str, kube_version: str) -> None:
    assert lint(values_of(values), kube_version) == []


def test_helm_lint_reports_what_the_schema_refuses() -> None:
    assert any("/replicaCount" in finding for finding in lint({"replicaCount": -1}, "v1.27.0"))


@pytest.mark.parametrize("values", VALUES_FILES)
def test_every_values_file_renders(values: str) -> None:
    assert sorted(item["kind"] for item in render(values)) == KINDS[values]


@pytest.mark.parametrize("version", versions())
@pytest.mark.parametrize("values", VALUES_FILES)
def test_every_object_validates_strictly(values: str, version: str) -> None:
    for manifest in render(values):
        if manifest["kind"] == "ServiceMonitor":
            assert monitoring_types.errors(manifest, version) == []
        elif manifest["apiVersion"].startswith("serving.kserve.io/"):
            assert kserve_types.errors(manifest, version) == []
        else:
            validate_object(manifest, version)


def test_the_servicemonitor_check_refuses_mistakes() -> None:
    monitor = copy.deepcopy(one(render("servicemonitor"), "ServiceMonitor"))
    monitor["spec"]["endpoints"][0]["interval"] = "15 seconds"
    monitor["spec"]["endpoint"] = monitor["spec"].pop("endpoints")
    monitor["spec"]["selector"]["matchLabel"] = monitor["spec"]["selector"].pop("matchLabels")
    found = monitoring_types.errors(monitor, versions()[-1])
    assert any("'endpoint' was unexpected" in error for error in found), found
    assert any("'endpoints' is a required property" in error for error in found), found
    assert any(error.startswith("ServiceMonitor.spec.selector.") and "matchLabel" in error for error in found)


@pytest.mark.parametrize("values", SAME_AS_KUSTOMIZE)
def test_the_chart_renders_what_the_kustomize_tree_renders(values: str) -> None:
    chart, tree = render(values), kustomize(TREES[SAME_AS_KUSTOMIZE[values]])
    # The pod as a whole: image, flags, environment, ports, probes, preStop, resources, GPU and
    # its toleration, security contexts, volumes, grace period.
    assert pod_spec(chart) == pod_spec(tree)
    template = one(chart, "Deployment")["spec"]["template"]
    assert (
        template["metadata"]["annotations"]
        == one(tree, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    )
    assert "replicas" not in one(chart, "Deployment")["spec"]  # the autoscaler owns the count
    # The autoscaler (its metric, the one prometheus-adapter-rules.yaml serves), the budget and the ports.
    assert one(chart, "HorizontalPodAutoscaler")["spec"] == one(tree, "HorizontalPodAutoscaler")["spec"]
    assert one(chart, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
    assert one(chart, "Service")["spec"]["ports"] == one(tree, "Service")["spec"]["ports"]


def test_the_kserve_runtime_is_deploy_kserves() -> None:
    chart = one(render("kserve"), "ClusterServingRuntime")
    tree = one(kustomize(TREES["kserve"]), "ClusterServingRuntime")
    assert chart["metadata"]["name"] == tree["metadata"]["name"]
    # The chart names the pull policy that deploy/kserve leaves to the default.
    assert chart["spec"]["containers"][0].pop("imagePullPolicy") == "IfNotPresent"
    assert chart["spec"] == tree["spec"]
    # An InferenceService like deploy/kserve's example finds it.
    example = yaml.safe_load((DEPLOY / "kserve" / "inference-service-example.yaml").read_text())
    assert example["spec"]["predictor"]["model"]["runtime"] == chart["metadata"]["name"]


@pytest.mark.parametrize("values", WITH_SERVER)
def test_selectors_find_the_pods(values: str) -> None:
    objects = render(values)
    deployment = one(objects, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    service = one(objects, "Service")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert one(objects, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"] == selector
    target = one(objects, "HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    if values == "servicemonitor":
        monitor = one(objects, "ServiceMonitor")
        assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
        ports = {port["name"]: port["port"] for port in service["spec"]["ports"]}
        [endpoint] = monitor["spec"]["endpoints"]
        assert ports[endpoint["port"]] == int(
            flag_values(server_container(objects)["args"])["--metrics-port"]
        )
        assert endpoint["path"] == "/metrics"


@pytest.mark.parametrize(
    ("server", "grace"), [({}, 45), ({"exitTimeoutSecs": 120, "preStopSleepSeconds": 10}, 140)]
)
def test_the_grace_period_covers_the_exit_timeout(server: dict[str, int], grace: int) -> None:
    objects = render_values({"server": server})
    pod, container = pod_spec(objects), server_container(objects)
    exit_timeout = float(flag_values(container["args"])["--exit-timeout-secs"])
    sleep = container["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep[0] == "sleep"
    assert pod["terminationGracePeriodSeconds"] == grace >= float(sleep[1]) + exit_timeout + 5


def test_ports_flags_and_probes_move_together() -> None:
    objects = render_values({"ports": {"http": 9100, "grpc": 9101, "metrics": 9102}})
    container = server_container(objects)
    flags = flag_values(container["args"])
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"http": 9100, "grpc": 9101, "metrics": 9102}
    assert (flags["--http-port"], flags["--grpc-port"], flags["--metrics-port"]) == ("9100", "9101", "9102")
    assert container["startupProbe"]["grpc"] == {"port": 9101}
    assert container["livenessProbe"]["httpGet"]["port"] == "http"
    annotations = one(objects, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == "9102"
    service_ports = {
        port["name"]: (port["port"], port["targetPort"]) for port in one(objects, "Service")["spec"]["ports"]
    }
    assert service_ports == {"http": (9100, "http"), "grpc": (9101, "grpc"), "metrics": (9102, "metrics")}


def test_extra_args_follow_the_charts_flags() -> None:
    args = server_container(render("s3"))["args"]
    assert args[-2:] == ["--model-control-mode=poll", "--repository-poll-secs=60"]
    flags = flag_values(args)
    assert flags["--model-repository"] == "s3://my-bucket/model_repository"


def test_an_s3_repository_takes_its_keys_from_the_secret() -> None:
    objects = render("s3")
    container = server_container(objects)
    env = env_of(container)
    assert env["AWS_DEFAULT_REGION"] == "eu-west-1"
    assert env["AWS_ACCESS_KEY_ID"] == {"secretKeyRef": {"name": "coreserve-s3", "key": "AWS_ACCESS_KEY_ID"}}
    assert env["AWS_SECRET_ACCESS_KEY"] == {
        "secretKeyRef": {"name": "coreserve-s3", "key": "AWS_SECRET_ACCESS_KEY"}
    }
    assert "AWS_SESSION_TOKEN" not in env
    # No claim: the repository is read over the network into the cache under /tmp.
    assert "models" not in {volume["name"] for volume in pod_spec(objects)["volumes"]}
    assert "/models" not in {mount["mountPath"] for mount in container["volumeMounts"]}


def test_a_gcs_repository_reads_a_mounted_key_file_or_the_pods_identity() -> None:
    objects = render("gcs")
    assert pod_spec(objects)["serviceAccountName"] == one(objects, "ServiceAccount")["metadata"]["name"]
    assert "GOOGLE_APPLICATION_CREDENTIALS" not in env_of(server_container(objects))
    values = values_of("gcs")
    values["modelRepository"]["gcs"] = {"secretName": "coreserve-gcs", "key": "sa.json"}
    objects = render_values(values)
    container = server_container(objects)
    path = env_of(container)["GOOGLE_APPLICATION_CREDENTIALS"]
    [mount] = [mount for mount in container["volumeMounts"] if path.startswith(mount["mountPath"] + "/")]
    assert mount["readOnly"] and path == f"{mount['mountPath']}/sa.json"
    [volume] = [volume for volume in pod_spec(objects)["volumes"] if volume["name"] == mount["name"]]
    assert volume["secret"] == {"secretName": "coreserve-gcs"}


def test_an_azure_repository_takes_the_account_key_or_a_connection_string() -> None:
    env = env_of(server_container(render("azure")))
    assert env["AZURE_STORAGE_KEY"] == {
        "secretKeyRef": {"name": "coreserve-azure", "key": "AZURE_STORAGE_KEY"}
    }
    assert "AZURE_STORAGE_CONNECTION_STRING" not in env
    values = values_of("azure")
    values["modelRepository"]["azure"].update(accountKeyKey="", connectionStringKey="connection")
    env = env_of(server_container(render_values(values)))
    assert env["AZURE_STORAGE_CONNECTION_STRING"] == {
        "secretKeyRef": {"name": "coreserve-azure", "key": "connection"}
    }
    assert "AZURE_STORAGE_KEY" not in env


def test_the_credentials_are_the_variables_coreserve_reads() -> None:
    # docs/serving/management.md lists each storage's variables; the chart sets no other.
    documented = set(
        re.findall(r"`([A-Z_]+)`", (DEPLOY.parent / "docs" / "serving" / "management.md").read_text())
    )
    values = {
        "s3": {"region": "r", "secretName": "s", "sessionTokenKey": "t"},
        "gcs": {"secretName": "s"},
        "azure": {"secretName": "s", "connectionStringKey": "c"},
    }
    urls = {"s3": "s3://b/p", "gcs": "gs://b/p", "azure": "as://account/container/p"}
    for storage, url in urls.items():
        repository = {"persistentVolumeClaim": {"claimName": ""}, "url": url, storage: values[storage]}
        env = set(env_of(server_container(render_values({"modelRepository": repository})))) - {"HOME"}
        assert env and env <= documented, (storage, env - documented)


def test_a_gpu_replica_asks_for_the_gpu_and_tolerates_its_taint() -> None:
    objects = render_values(
        {"gpu": {"count": 2}, "tolerations": [{"key": "dedicated", "operator": "Exists"}]}
    )
    assert server_container(objects)["resources"]["limits"] == {"memory": "4Gi", "nvidia.com/gpu": 2}
    assert pod_spec(objects)["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Exists"},
    ]
    assert "nvidia.com/gpu" not in server_container(render("defaults"))["resources"]["limits"]
    assert "tolerations" not in pod_spec(render("defaults"))


def test_the_autoscaler_the_budget_and_the_probes_can_be_turned_off() -> None:
    objects = render_values(
        {
            "autoscaling": {"enabled": False},
            "replicaCount": 3,
            "podDisruptionBudget": {"enabled": False},
            "probes": {"startup": {"enabled": False}},
        }
    )
    assert sorted(item["kind"] for item in objects) == ["Deployment", "Service"]
    assert one(objects, "Deployment")["spec"]["replicas"] == 3
    container = server_container(objects)
    assert "startupProbe" not in container and "livenessProbe" in container and "readinessProbe" in container


def test_image_pull_settings() -> None:
    objects = render_values(
        {"image": {"digest": "sha256:" + "a" * 64, "pullPolicy": "Always", "pullSecrets": ["registry"]}}
    )
    container = server_container(objects)
    assert container["image"] == "registry.example.com/coreserve@sha256:" + "a" * 64
    assert container["imagePullPolicy"] == "Always"
    assert pod_spec(objects)["imagePullSecrets"] == [{"name": "registry"}]


REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "a negative replica count": ({"replicaCount": -1}, "at '/replicaCount': minimum: got -1, want 0"),
    "an unknown repository kind": (
        {"modelRepository": {"persistentVolumeClaim": {"claimName": ""}, "url": "http://host/models"}},
        "modelRepository.url: http://host/models is not a repository coreserve reads: s3://",
    ),
    "both a claim and a URL": (
        {"modelRepository": {"url": "s3://bucket/models"}},
        "modelRepository: both a claim (persistentVolumeClaim.claimName=coreserve-models) and a URL (url=s3://bucket/models) are set",
    ),
    "neither a claim nor a URL": (
        {"modelRepository": {"persistentVolumeClaim": {"claimName": ""}}},
        "modelRepository: neither a claim (persistentVolumeClaim.claimName) nor a URL",
    ),
    "credentials of another storage": (
        {
            "modelRepository": {
                "persistentVolumeClaim": {"claimName": ""},
                "url": "gs://b/p",
                "s3": {"secretName": "keys"},
            }
        },
        "modelRepository.s3.secretName is set, but the repository is the URL gs://b/p: credentials for s3 are read only with a s3:// URL",
    ),
    "a misspelt field": (
        {"autoscaling": {"maxReplica": 4}},
        "at '/autoscaling': additional properties 'maxReplica' not allowed",
    ),
    "fewer maximum than minimum replicas": (
        {"autoscaling": {"minReplicas": 4, "maxReplicas": 2}},
        "autoscaling: maxReplicas (2) is below minReplicas (4)",
    ),
    "an unknown pull policy": ({"image": {"pullPolicy": "Sometimes"}}, "at '/image/pullPolicy'"),
    "a port out of range": ({"ports": {"http": 70000}}, "at '/ports/http': maximum: got 70,000, want 65,535"),
    "a flag that is not one": (
        {"server": {"extraArgs": ["model-control-mode=poll"]}},
        "at '/server/extraArgs/0'",
    ),
    "an unknown log format": ({"server": {"logFormat": "json"}}, "at '/server/logFormat'"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_bad_values_are_refused_with_a_message_naming_them(case: str) -> None:
    values, message = REFUSED[case]
    assert message in refusal(values)


def test_the_readme_tables_every_value() -> None:
    table = {
        match for match in re.findall(r"^\| `([\w.]+)` \|", (CHART / "README.md").read_text(), re.MULTILINE)
    }
    assert table == set(_leaves(yaml.safe_load((CHART / "values.yaml").read_text())))


def _leaves(values: dict[str, Any], prefix: str = "") -> list[str]:
    """The documented fields of values.yaml: its leaves, and the mappings it leaves open
    (resources, nodeSelector …) as a whole."""
    open_mappings = {
        "resources",
        "nodeSelector",
        "affinity",
        "podSecurityContext",
        "securityContext",
        "behavior",
        "labels",
        "annotations",
        "podLabels",
        "podAnnotations",
        "kserve.resources",
        "kserve.securityContext",
        "kserve.nodeSelector",
    }
    leaves = []
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value and key not in open_mappings and name not in open_mappings:
            leaves += _leaves(value, f"{name}.")
        else:
            leaves.append(name)
    return leaves


def test_the_release_namespace_is_left_to_helm() -> None:
    # Objects carry no namespace, so `helm install -n` places them (the ServiceMonitor may name its own).
    for values in VALUES_FILES:
        for manifest in render(values):
            assert "namespace" not in manifest["metadata"], (values, manifest["kind"])
    monitor = one(
        render_values({"serviceMonitor": {"enabled": True, "namespace": "monitoring"}}), "ServiceMonitor"
    )
    assert monitor["metadata"]["namespace"] == "monitoring"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
