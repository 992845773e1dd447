"""KubernetesJob end to end: the real ``kubernetes`` client against the fake API server,
whose kubelet runs real ``monarch worker`` processes in network-namespace hosts; the
clients (``k8s_client.py``) run in the client namespace, as a client pod would.
"""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

import pytest
import yaml
from k8s_env import NAMESPACE, FakeK8s

MANIFESTS = Path(__file__).resolve().parents[2] / "python/monarch/_src/job/manifests"

pytestmark = pytest.mark.timeout(240)


def _host_ips(fake: FakeK8s, n: int) -> set[str]:
    return {h.ip for h in fake.cluster.hosts[:n]}


def _pod_ips(fake: FakeK8s, selector: str) -> set[str]:
    return {p["status"].get("podIP") for p in fake.api.pods(NAMESPACE, selector)}


def _mesh_creates(fake: FakeK8s) -> int:
    return sum(1 for m, p in fake.api.requests if m == "POST" and "monarchmeshes" in p)


def test_provision_call_reconnect_kill(fake_k8s: FakeK8s) -> None:
    """K8S-2, K8S-3: a provisioned 2-replica mesh answers an actor; a second client
    reconnects through the state cache (no second MonarchMesh); kill deletes the
    MonarchMesh and returns once its pods and workers are gone."""
    fake = fake_k8s
    code, result, out = fake.client(
        "state", "--image", "monarch:test", "--cache", "job.pkl", "--call", "--timeout", "60"
    )
    assert code == 0, out
    assert result["sizes"] == {"hosts": 2}
    assert sorted(result["ips"]) == sorted(_pod_ips(fake, "monarch.pytorch.org/mesh-name=trainers"))
    mesh = fake.api.mesh(NAMESPACE, "trainers")
    assert mesh is not None
    assert mesh["spec"]["replicas"] == 2 and mesh["spec"]["port"] == 26600
    container = mesh["spec"]["podTemplate"]["spec"]["containers"][0]
    assert container["image"] == "monarch:test"
    secret = fake.api.secret_value(NAMESPACE, "monarch-cluster-secret", "secret")
    assert secret, "provisioning creates the cluster secret"

    code, result, out = fake.client(
        "state", "--image", "monarch:test", "--cache", "job.pkl", "--call", "--timeout", "60"
    )
    assert code == 0, out
    assert len(result["ips"]) == 2
    assert _mesh_creates(fake) == 1, "the second client reused the cached job"

    workers = fake.kubelet.processes()
    assert len(workers) == 2
    code, result, out = fake.client("kill", "--cache", "job.pkl")
    assert code == 0, out
    assert fake.api.mesh(NAMESPACE, "trainers") is None
    assert fake.api.pods(NAMESPACE) == [], "kill returns once the pods are gone"
    assert all(w.poll() is not None for w in workers)


def _statefulset_pod(fake: FakeK8s, name: str, labels: dict[str, str], probe: bool = True) -> dict:
    """A pod as the shipped StatefulSet makes it, without the pod-index label."""
    docs = list(yaml.safe_load_all((MANIFESTS / "monarch-workers.yaml").read_text()))
    template = copy.deepcopy(
        next(d for d in docs if d["kind"] == "StatefulSet")["spec"]["template"]
    )
    if not probe:
        del template["spec"]["containers"][0]["readinessProbe"]
    return {"metadata": {"name": name, "labels": labels}, "spec": template["spec"]}


def _create_secret(fake: FakeK8s) -> None:
    fake.api.create_secret(
        NAMESPACE,
        {"metadata": {"name": "monarch-cluster-secret"}, "stringData": {"secret": "s3cret"}},
    )


def test_preprovisioned_by_selector_with_statefulset_ordinals(fake_k8s: FakeK8s) -> None:
    """Pods without the pod-index label are ranked by their StatefulSet ordinal; kill
    ends their workers and leaves the pods."""
    fake = fake_k8s
    _create_secret(fake)
    from kubernetes import client, config

    api_client = config.new_client_from_config(config_file=str(fake.kubeconfig))
    core = client.CoreV1Api(api_client)
    for i in (1, 0):
        core.create_namespaced_pod(
            NAMESPACE, _statefulset_pod(fake, f"workers-{i}", {"team": "a", "tier": "gpu"})
        )
    # A pod the selector leaves out, and one without an ordinal it does not.
    core.create_namespaced_pod(NAMESPACE, _statefulset_pod(fake, "other-0", {"team": "b"}))
    api_client.close()
    selector = "team in (a,c),tier!=cpu,tier"
    code, result, out = fake.client(
        "state", "--selector", selector, "--cache", "job.pkl", "--call", "--timeout", "60"
    )
    assert code == 0, out
    by_name = {p["metadata"]["name"]: p["status"]["podIP"] for p in fake.api.pods(NAMESPACE)}
    assert result["ips"] == [by_name["workers-0"], by_name["workers-1"]], "rank = ordinal"

    workers = [p for p in fake.kubelet.processes()]
    code, result, out = fake.client("kill", "--cache", "job.pkl")
    assert code == 0, out
    fake.events.wait(
        lambda: all(
            p["status"]["phase"] in ("Succeeded", "Failed")
            for p in fake.api.pods(NAMESPACE, "team=a")
        ),
        30,
        "the workers of the selected pods ending",
    )
    assert len(fake.api.pods(NAMESPACE)) == 3, "kill leaves pre-provisioned pods"
    assert sum(w.poll() is None for w in workers) == 1, "only other-0's worker still runs"


def test_ready_pod_whose_worker_does_not_listen_is_not_used(fake_k8s: FakeK8s) -> None:
    """K8S-1: without a readiness probe a pod is Ready as soon as its container runs; a
    worker that does not listen yet keeps the job waiting (here until its timeout),
    and once it listens the job uses it."""
    fake = fake_k8s
    _create_secret(fake)
    gates = []
    for i in range(2):
        gate = fake.tmp / f"gate-{i}"
        os.mkfifo(gate)
        gates.append(gate)
        pod = _statefulset_pod(fake, f"late-{i}", {"app": "late"}, probe=False)
        container = pod["spec"]["containers"][0]
        # The kubelet runs `python` as this interpreter; in a shell it must be named.
        worker = " ".join([sys.executable, *container["command"][1:], *container["args"]])
        container["command"] = ["sh", "-c", f"read _ < {gate}; exec {worker}"]
        container["args"] = []
        fake.api.create_pod(NAMESPACE, pod)
    fake.events.wait(
        lambda: (
            all(
                any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in p["status"]["conditions"]
                )
                for p in fake.api.pods(NAMESPACE, "app=late")
            )
            and len(fake.api.pods(NAMESPACE, "app=late")) == 2
        ),
        30,
        "both pods Ready",
    )
    code, result, out = fake.client("state", "--selector", "app=late", "--timeout", "3")
    assert code == 1, out
    assert "does not answer" in out and "late-0" in out and "late-1" in out, out

    for gate in gates:  # the workers start
        with open(gate, "w") as f:
            f.write("go\n")
    code, result, out = fake.client("state", "--selector", "app=late", "--call", "--timeout", "60")
    assert code == 0, out
    assert len(result["ips"]) == 2


def test_timeout_names_what_each_rank_lacks(fake_k8s: FakeK8s) -> None:
    """Pods that never become ready: state() fails at the timeout, saying per rank."""
    fake = fake_k8s
    _create_secret(fake)
    pod = _statefulset_pod(fake, "slow-0", {"app": "slow"})
    pod["spec"]["containers"][0]["command"] = ["sleep", "600"]
    pod["spec"]["containers"][0]["args"] = []
    fake.api.create_pod(NAMESPACE, pod)
    code, _result, out = fake.client("state", "--selector", "app=slow", "--timeout", "2")
    assert code == 1, out
    assert "not ready within 2 s" in out, out
    assert "rank 0: pod slow-0 (Running, not Ready)" in out, out
    assert "rank 1: no pod" in out, out


def test_ddp_example(fake_k8s: FakeK8s) -> None:
    """examples/kubernetes/ddp_kubernetes.py trains across the pods of its StatefulSet
    (ddp-workers.yaml, without a GPU here) and ends their workers."""
    fake = fake_k8s
    _create_secret(fake)
    example = MANIFESTS.parents[4] / "examples/kubernetes"
    docs = list(yaml.safe_load_all((example / "ddp-workers.yaml").read_text()))
    template = next(d for d in docs if d["kind"] == "StatefulSet")["spec"]["template"]
    del template["spec"]["containers"][0]["resources"]  # no GPUs here
    for i in range(2):
        fake.api.create_pod(
            NAMESPACE,
            {
                "metadata": {"name": f"trainers-{i}", **template["metadata"]},
                "spec": template["spec"],
            },
        )
    code, out = fake.run(
        example / "ddp_kubernetes.py",
        "--kubeconfig",
        str(fake.kubeconfig),
        "--namespace",
        NAMESPACE,
        "--steps",
        "2",
        "--timeout",
        "60",
        "--kill",
        timeout=180,
    )
    assert code == 0, out
    assert "same parameters everywhere: True" in out, out


def test_out_of_cluster_client_through_one_pods_port(fake_k8s: FakeK8s) -> None:
    """``KubernetesJob(attach_to=...)`` (upstream's out-of-cluster mode): a client whose
    network reaches the API server and one pod only (every other pod's address is an
    unreachable route in its namespace) attaches through that pod's worker, and drives
    every pod of the mesh through it."""
    fake = fake_k8s
    code, result, out = fake.client(
        "state", "--image", "monarch:test", "--cache", "job.pkl", "--timeout", "60"
    )
    assert code == 0, out
    pods = sorted(
        fake.api.pods(NAMESPACE, "monarch.pytorch.org/mesh-name=trainers"),
        key=lambda p: p["metadata"]["name"],
    )
    gateway_ip = pods[0]["status"]["podIP"]
    blocked = [h.ip for h in fake.cluster.hosts if h.ip != gateway_ip]
    route = ["ip", "route"]
    try:
        for ip in blocked:
            fake.cluster.client.run(
                [*route, "add", "unreachable", f"{ip}/32"], timeout=10, check=True
            )
        code, result, out = fake.client(
            "state",
            "--image",
            "monarch:test",
            "--attach-to",
            f"tcp://{gateway_ip}:26600",
            "--call",
            "--timeout",
            "60",
        )
    finally:
        for ip in blocked:
            fake.cluster.client.run([*route, "del", "unreachable", f"{ip}/32"], timeout=10)
    assert code == 0, out
    assert result["client"].endswith(f"@tcp:{gateway_ip}:26600"), result
    assert sorted(result["ips"]) == sorted(p["status"]["podIP"] for p in pods)
    code, result, out = fake.client("kill", "--cache", "job.pkl")
    assert code == 0, out
