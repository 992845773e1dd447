"""The shipped Kubernetes manifests, validated offline: the standard kinds against the
Kubernetes schemas (``kubernetes-validate``), and the MonarchMesh bodies KubernetesJob
sends against the shipped CRD's schema (``jsonschema``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

kubernetes_validate = pytest.importorskip("kubernetes_validate")
jsonschema = pytest.importorskip("jsonschema")
yaml = pytest.importorskip("yaml")

from monarch.job.kubernetes import ImageSpec, KubernetesJob  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = sorted(
    [
        *(ROOT / "python/monarch/_src/job/manifests").glob("*.yaml"),
        *(ROOT / "examples/kubernetes").glob("*.yaml"),
    ]
)
#: The Kubernetes version whose schemas the manifests are checked against.
K8S_VERSION = "1.30"

pytestmark = pytest.mark.timeout(60)


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_standard_kinds_validate(path: Path) -> None:
    docs = _documents(path)
    assert docs
    for doc in docs:
        if doc["kind"] == "MonarchMesh":
            continue  # a custom resource: checked against the CRD below
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_validation_catches_a_mistake() -> None:
    doc = _documents(ROOT / "python/monarch/_src/job/manifests/monarch-workers.yaml")[1]
    doc["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def _crd_schema() -> dict[str, Any]:
    (crd,) = _documents(ROOT / "python/monarch/_src/job/manifests/monarchmesh-crd.yaml")
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def test_monarchmesh_bodies_match_the_crd() -> None:
    """K8S-3: what KubernetesJob sends is a valid MonarchMesh; a bad one is not."""
    job = KubernetesJob("ns")
    job.add_mesh(
        "trainers", 4, image_spec=ImageSpec("img", {"nvidia.com/gpu": 8}), labels={"a": "b"}
    )
    job.add_mesh("custom", 1, pod_template={"spec": {"containers": [{"name": "w", "image": "i"}]}})
    schema = _crd_schema()
    for spec in job._meshes.values():
        body = job._mesh_body(spec)
        jsonschema.validate(body, schema)
        assert set(body["spec"]) == {"replicas", "port", "podTemplate"}
    body = job._mesh_body(job._meshes["trainers"])
    body["spec"]["replicas"] = 0
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(body, schema)
    for doc in (d for p in MANIFESTS for d in _documents(p) if d["kind"] == "MonarchMesh"):
        jsonschema.validate(doc, schema)


def test_provisioned_pod_template_validates_as_a_pod() -> None:
    """The pod template an ImageSpec makes is a valid Kubernetes pod spec."""
    job = KubernetesJob("ns")
    job.add_mesh("trainers", 2, image_spec=ImageSpec("img", {"cpu": 2}))
    template = job._meshes["trainers"].pod_template
    assert template is not None
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, **template}
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
