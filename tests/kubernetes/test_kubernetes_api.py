"""KubernetesJob against the fake API server without hosts (no pod ever starts): the
MonarchMesh create/patch/delete paths with real 404/409 answers, the label selectors
of the fake, pickling, argument checks, and the import without ``kubernetes``.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_apiserver import FakeApiServer, matches

from monarch.job.kubernetes import ImageSpec, KubeConfig, KubernetesJob

pytestmark = pytest.mark.timeout(60)
NS = "ns"


@pytest.fixture
def api(tmp_path: Path) -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


def _job(api: FakeApiServer, tmp_path: Path, replicas: int = 2, **mesh: object) -> KubernetesJob:
    job = KubernetesJob(
        NS, timeout=5, kubeconfig=KubeConfig.from_path(api.write_kubeconfig(tmp_path / "kc"))
    )
    job.add_mesh("trainers", replicas, image_spec=ImageSpec("img:1"), **mesh)  # type: ignore[arg-type]
    return job


def test_apply_creates_then_patches_on_409(api: FakeApiServer, tmp_path: Path) -> None:
    _job(api, tmp_path).apply()
    mesh = api.mesh(NS, "trainers")
    assert mesh is not None and mesh["spec"]["replicas"] == 2
    # Another job with the same mesh name: the create answers 409, the job patches.
    _job(api, tmp_path, replicas=3, labels={"team": "a"}).apply()
    mesh = api.mesh(NS, "trainers")
    assert mesh is not None
    assert mesh["spec"]["replicas"] == 3 and mesh["metadata"]["labels"] == {"team": "a"}
    assert mesh["metadata"]["generation"] == 2
    methods = [m for m, p in api.requests if "monarchmeshes" in p]
    assert methods == ["POST", "POST", "PATCH"]


def test_kill_when_the_mesh_is_already_gone(api: FakeApiServer, tmp_path: Path) -> None:
    """K8S-2: a 404 on delete is fine; kill returns at once without pods."""
    job = _job(api, tmp_path)
    job.apply()
    api.delete_mesh(NS, "trainers")
    job.kill()
    assert not job.active
    deletes = [p for m, p in api.requests if m == "DELETE"]
    assert len(deletes) == 1


def test_real_statuses(api: FakeApiServer, tmp_path: Path) -> None:
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException

    api_client = config.new_client_from_config(
        config_file=str(api.write_kubeconfig(tmp_path / "k"))
    )
    custom = client.CustomObjectsApi(api_client)
    args = ("monarch.pytorch.org", "v1alpha1", NS, "monarchmeshes")
    with pytest.raises(ApiException) as info:
        custom.get_namespaced_custom_object(*args, "nope")
    assert info.value.status == 404 and '"reason": "NotFound"' in info.value.body
    with pytest.raises(ApiException) as info:
        custom.create_namespaced_custom_object(
            *args, {"metadata": {"name": "bad"}, "spec": {"replicas": 0, "podTemplate": {}}}
        )
    assert info.value.status == 422, "the CRD's schema rejects replicas 0"
    api_client.close()


def test_selectors() -> None:
    labels = {"a": "1", "b": "x"}
    assert matches("a=1,b in (x,y)", labels)
    assert matches("a==1,c notin (z),!c,b", labels)
    assert not matches("a!=1", labels)
    assert not matches("c", labels)
    assert not matches("b in (y)", labels)


def test_job_pickles_without_client_objects(tmp_path: Path, api: FakeApiServer) -> None:
    job = _job(api, tmp_path)
    data = pickle.dumps(job)
    assert b"kubernetes.client" not in data
    again = pickle.loads(data)
    assert again._meshes == job._meshes and again._kubeconfig == job._kubeconfig


def test_argument_checks() -> None:
    job = KubernetesJob(NS)
    for bad in ("", "Trainers", "a-b", "1abc", "x" * 64):
        with pytest.raises(ValueError, match=r"mesh name|non-empty"):
            job.add_mesh(bad, 1)
    with pytest.raises(ValueError, match="not both"):
        job.add_mesh("a", 1, image_spec=ImageSpec("i"), pod_template={"spec": {}})
    with pytest.raises(ValueError, match="pre-provisioned"):
        job.add_mesh("a", 1, image_spec=ImageSpec("i"), label_selector="x=y")
    with pytest.raises(ValueError, match="provisioned mesh"):
        job.add_mesh("a", 1, labels={"x": "y"})
    # attach_to is a gateway's address (upstream's out-of-cluster mode).
    assert KubernetesJob(NS, attach_to="tcp://127.0.0.1:26600")._attach_to == (
        "tcp://127.0.0.1:26600"
    )
    for bad in ("127.0.0.1", "pod-0", 26600):
        with pytest.raises(ValueError, match="port-forward"):
            KubernetesJob(NS, attach_to=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no meshes"):
        KubernetesJob(NS).apply()


def test_without_the_kubernetes_package() -> None:
    code = (
        "import sys; sys.modules['kubernetes'] = None\n"
        "import monarch.job, monarch.job.kubernetes as k\n"
        "k.ImageSpec('i'); k.KubeConfig()\n"
        "try:\n    k.KubernetesJob('ns')\n"
        "except ImportError as e:\n    print('IMPORTERROR', e)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert "IMPORTERROR" in done.stdout and "pip install kubernetes" in done.stdout


def test_monarch_job_does_not_import_kubernetes() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import sys, monarch.job; print('kubernetes' in sys.modules)"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.strip() == "False"
