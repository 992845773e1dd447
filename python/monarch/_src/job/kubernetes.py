"""Kubernetes jobs: host meshes made of pods, each running ``monarch worker``.

:class:`KubernetesJob` finds its hosts in two ways, chosen per mesh by
:meth:`KubernetesJob.add_mesh`:

- **provisioning** (``image_spec=`` or ``pod_template=``): ``apply()`` creates (or, if it
  exists, merge-patches) a ``MonarchMesh`` custom resource (``monarch.pytorch.org/
  v1alpha1``), which the MonarchMesh operator turns into a StatefulSet and a headless
  Service ``<name>-svc``; ``kill()`` deletes it and waits until its pods are gone.
- **pre-provisioned** (neither): the pods already exist (a StatefulSet of the manifests
  shipped in ``monarch/_src/job/manifests``, another scheduler, hand-made pods) and are
  found by label selector; ``kill()`` ends their monarch workers (``HostMesh.shutdown``),
  it does not delete pods it did not create.

Either way ``state()`` watches the pods (a watch, not polling) until rank 0 .. N-1 of
every mesh are Ready *and their workers answer*: a TCP connection to the worker's port
succeeds and the monarch attach probe (``HostMesh.initialized``) completes. A pod whose
container started but whose worker does not listen yet is not used. The rank of a pod
is its ``pod_rank_label`` (``apps.kubernetes.io/pod-index``, set by Kubernetes 1.28+),
or, where that label is missing, the ordinal of its StatefulSet name ``<set>-<N>``.

Workers authenticate every TCP connection with the cluster secret
(``MONARCH_CLUSTER_SECRET``), which pods read from the Kubernetes Secret
``monarch-cluster-secret`` (key ``secret``). The client uses its own
``MONARCH_CLUSTER_SECRET`` when set, else reads that Secret; provisioning creates the
Secret (a random value) when it does not exist.

Out of cluster (upstream's ``attach_to=``): a client that reaches the API server and
one worker's port only (``kubectl port-forward``) attaches through that worker, its
gateway (``monarch.actor.attach``), before any host mesh; the workers' answer (K8S-1)
is then monarch's probe through the gateway, not a TCP connection to each pod.

A job holds only plain data (no API client, no connection): it pickles into the state
cache, and a later process reconnects to the same pods (``can_run`` checks they are
still Ready and answering). The ``kubernetes`` package is imported on first use only.

Invariants (tests cite them):

- K8S-1: a pod is used only once its worker answers, never on its Ready condition alone.
- K8S-2: ``kill()`` works in both modes and returns once provisioned pods are gone.
- K8S-3: the MonarchMesh body is the one upstream's operator expects (``replicas``,
  ``port``, ``podTemplate``; metadata ``name``, ``namespace``, ``labels``,
  ``annotations``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import re
import secrets
import socket
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from monarch._src.job.job import JobState, JobTrait, _refuse_batch

if TYPE_CHECKING:
    from monarch._src.actor.proc_mesh import HostMesh

__all__ = ["ImageSpec", "KubeConfig", "KubernetesJob"]

logger = logging.getLogger(__name__)

#: The MonarchMesh custom resource.
GROUP = "monarch.pytorch.org"
VERSION = "v1alpha1"
PLURAL = "monarchmeshes"
KIND = "MonarchMesh"
#: The port workers listen on unless a mesh says otherwise.
DEFAULT_PORT = 26600
#: The label Kubernetes 1.28+ puts on StatefulSet pods: their ordinal.
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
#: Labels the MonarchMesh operator (and the shipped manifests) put on worker pods.
APP_LABEL = "app.kubernetes.io/name"
APP_VALUE = "monarch-worker"
MESH_LABEL = "monarch.pytorch.org/mesh-name"
#: The Secret holding the cluster secret, and its key.
SECRET_NAME = "monarch-cluster-secret"
SECRET_KEY = "secret"
SECRET_ENV = "MONARCH_CLUSTER_SECRET"

_NAME_MAX = 63
_ORDINAL = re.compile(r"^(?P<set>.+)-(?P<ordinal>\d+)$")
_INSTALL_HINT = "KubernetesJob needs the kubernetes client: pip install kubernetes"


def _kubernetes() -> Any:
    """The ``kubernetes`` package, imported on first use."""
    try:
        import kubernetes
    except ImportError as e:
        raise ImportError(f"{_INSTALL_HINT} ({e})") from e
    return kubernetes


def _api_exception() -> type[Exception]:
    exc: type[Exception] = _kubernetes().client.exceptions.ApiException
    return exc


@dataclasses.dataclass(frozen=True)
class ImageSpec:
    """A container image for provisioned workers, and optional resources (requests and
    limits both), e.g. ``ImageSpec("ghcr.io/meta-pytorch/monarch:latest",
    resources={"nvidia.com/gpu": 4})``. The image must have ``python`` with monarch on
    its ``PATH``: workers run ``python -m monarch.tools.cli worker``."""

    image: str
    resources: dict[str, str | int] | None = None


@dataclasses.dataclass(frozen=True)
class KubeConfig:
    """Where the Kubernetes API is: a kubeconfig file (``KubeConfig.from_path``), a
    ``kubernetes.client.Configuration`` (``KubeConfig.from_config``), or, with neither,
    the in-cluster service account of the pod the client runs in.

    A ``Configuration`` may hold credentials in memory; a job using one pickles it
    into the state cache with the job (prefer a kubeconfig file there)."""

    local: Path | None = None
    remote: Any = None

    @classmethod
    def from_path(cls, path: str | os.PathLike[str]) -> KubeConfig:
        """The kubeconfig file at ``path`` (``~`` expanded)."""
        return cls(local=Path(path).expanduser())

    @classmethod
    def from_config(cls, config: Any) -> KubeConfig:
        """A ``kubernetes.client.Configuration`` made by the caller."""
        return cls(remote=config)

    @property
    def out_of_cluster(self) -> bool:
        """Whether this names a cluster explicitly (not the in-cluster account)."""
        return self.local is not None or self.remote is not None

    def api_client(self) -> Any:
        """A new ``kubernetes.client.ApiClient`` for this configuration; close it after
        use (it is a context manager).

        Raises:
            RuntimeError: the kubeconfig cannot be loaded, or, with neither a file nor a
                configuration, this process does not run in a pod.
        """
        k8s = _kubernetes()
        if self.remote is not None:
            return k8s.client.ApiClient(configuration=self.remote)
        configuration = k8s.client.Configuration()
        try:
            if self.local is not None:
                k8s.config.load_kube_config(
                    config_file=str(self.local), client_configuration=configuration
                )
            else:
                k8s.config.load_incluster_config(client_configuration=configuration)
        except (k8s.config.ConfigException, OSError) as e:
            where = (
                f"the kubeconfig file {str(self.local)!r}"
                if self.local is not None
                else "the in-cluster configuration (this process is not in a pod); pass "
                "kubeconfig=KubeConfig.from_path('~/.kube/config') outside the cluster"
            )
            raise RuntimeError(f"KubernetesJob: cannot load {where}: {e}") from e
        return k8s.client.ApiClient(configuration=configuration)


@dataclasses.dataclass(frozen=True)
class _MeshSpec:
    """One mesh of a job, as plain data (pickled with the job)."""

    name: str
    num_replicas: int
    label_selector: str
    pod_rank_label: str
    port: int
    #: The pod template of a provisioned mesh, as the JSON the API takes; ``None`` for a
    #: pre-provisioned one.
    pod_template: dict[str, Any] | None
    labels: dict[str, str] | None
    annotations: dict[str, str] | None

    @property
    def provisioned(self) -> bool:
        return self.pod_template is not None


@dataclasses.dataclass(frozen=True)
class _Pod:
    """What the job needs of a pod."""

    name: str
    rank: int | None
    ip: str | None
    port: int
    ready: bool
    phase: str

    @property
    def address(self) -> str:
        return f"tcp://{self.ip}:{self.port}"

    def describe(self) -> str:
        return f"pod {self.name} ({self.phase}, {'Ready' if self.ready else 'not Ready'})"


def _worker_pod_template(image_spec: ImageSpec, port: int) -> dict[str, Any]:
    """The pod template of a provisioned worker: ``monarch worker`` at the pod's IP (the
    downward API's ``status.podIP``), the cluster secret from the Secret, and a
    readiness probe on the worker's port."""
    container: dict[str, Any] = {
        "name": "worker",
        "image": image_spec.image,
        "command": ["python", "-m", "monarch.tools.cli", "worker"],
        "args": ["--address", "tcp://$(POD_IP):$(MONARCH_PORT)"],
        "env": [
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "MONARCH_PORT", "value": str(port)},
            {
                "name": SECRET_ENV,
                "valueFrom": {"secretKeyRef": {"name": SECRET_NAME, "key": SECRET_KEY}},
            },
        ],
        "ports": [{"name": "monarch", "containerPort": port, "protocol": "TCP"}],
        "readinessProbe": {"tcpSocket": {"port": "monarch"}, "periodSeconds": 2},
    }
    if image_spec.resources:
        amounts = {str(k): str(v) for k, v in image_spec.resources.items()}
        container["resources"] = {"requests": amounts, "limits": dict(amounts)}
    return {"spec": {"containers": [container]}}


def _template_json(pod_template: Any) -> dict[str, Any]:
    """A pod template (a ``V1PodTemplateSpec`` or its JSON) as JSON."""
    if isinstance(pod_template, Mapping):
        return dict(pod_template)
    k8s = _kubernetes()
    if not isinstance(pod_template, k8s.client.V1PodTemplateSpec):
        raise TypeError(
            f"add_mesh(pod_template={pod_template!r}): expected a "
            "kubernetes.client.V1PodTemplateSpec or its JSON (a dict)"
        )
    body: dict[str, Any] = k8s.client.ApiClient().sanitize_for_serialization(pod_template)
    return body


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError(f"add_mesh(name={name!r}): give a non-empty mesh name, e.g. 'trainers'")
    if (
        len(name) > _NAME_MAX
        or not name.isascii()
        or not name.isalnum()
        or not name.islower()
        or not name[0].isalpha()
    ):
        raise ValueError(
            f"add_mesh(name={name!r}): a mesh name is at most {_NAME_MAX} lowercase letters "
            "and digits, starting with a letter (it names the MonarchMesh, its StatefulSet "
            "and its pods), e.g. 'trainers' or 'workers2'"
        )
    return name


class KubernetesJob(JobTrait):
    """Host meshes made of Kubernetes pods (see the module docs).

    ``namespace`` is where the pods (and MonarchMesh resources) are; ``timeout`` is
    how many seconds ``state()`` waits for each mesh's workers (``None``: forever);
    ``kubeconfig`` says where the API is (default: the in-cluster account).

    ``attach_to`` (upstream's out-of-cluster mode) is the address of one worker's port
    as this machine reaches it, e.g. ``"tcp://127.0.0.1:26600"`` after ``kubectl
    port-forward pod/<a worker pod> 26600:26600``: every worker's port doubles as a
    gateway, and ``state()`` attaches this client through it
    (``monarch.actor.attach``) before any host mesh, so the client needs no route to
    the pods' IPs; it must then be the program's first monarch call. The workers'
    readiness (K8S-1) is then checked through the gateway. Without it the client dials
    the pods' IPs (see [Kubernetes](../kubernetes.md)).

    Raises:
        ImportError: the ``kubernetes`` package is missing (``pip install kubernetes``).
        ValueError: an argument is invalid (``attach_to`` not an address).
    """

    #: Seconds ``kill()`` waits for the pods of deleted MonarchMesh resources to go.
    kill_timeout: float = 120.0
    #: Seconds a TCP connection to a worker may take before it counts as not answering.
    probe_timeout: float = 2.0
    #: Longest watch request (seconds); a watch is re-opened after it.
    watch_window: float = 30.0
    #: The gateway of an out-of-cluster client (``attach_to``); a class default, so that
    #: a job pickled before it existed still loads.
    _attach_to: str | None = None

    def __init__(
        self,
        namespace: str,
        timeout: int | None = None,
        kubeconfig: KubeConfig | None = None,
        attach_to: str | None = None,
    ) -> None:
        _kubernetes()
        if not isinstance(namespace, str) or not namespace:
            raise ValueError(f"KubernetesJob(namespace={namespace!r}): give a namespace name")
        if timeout is not None and not timeout > 0:
            raise ValueError(f"KubernetesJob(timeout={timeout!r}): give seconds > 0, or None")
        if attach_to is not None and (
            not isinstance(attach_to, str)
            or ("://" not in attach_to and not attach_to.startswith(("tcp:", "unix:")))
        ):
            raise ValueError(
                f"KubernetesJob(attach_to={attach_to!r}): expected the address of a worker's "
                "port as this machine reaches it, e.g. 'tcp://127.0.0.1:26600' after "
                "`kubectl port-forward pod/<worker pod> 26600:26600`"
            )
        super().__init__()
        self._namespace = namespace
        self._timeout = timeout
        self._kubeconfig = kubeconfig or KubeConfig()
        self._attach_to = attach_to
        self._meshes: dict[str, _MeshSpec] = {}

    def add_mesh(
        self,
        name: str,
        num_replicas: int,
        label_selector: str | None = None,
        pod_rank_label: str = POD_INDEX_LABEL,
        image_spec: ImageSpec | None = None,
        port: int = DEFAULT_PORT,
        pod_template: Any = None,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
    ) -> None:
        """Add the mesh ``name`` of ``num_replicas`` hosts (pods).

        With ``image_spec`` (an :class:`ImageSpec`) or ``pod_template`` (a
        ``V1PodTemplateSpec`` or its JSON), the mesh is provisioned through a
        MonarchMesh resource (``labels`` and ``annotations`` go on its metadata).
        Otherwise existing pods are used: those matching ``label_selector`` (default
        ``app.kubernetes.io/name=monarch-worker,monarch.pytorch.org/mesh-name=<name>``),
        ranked by ``pod_rank_label`` or their StatefulSet ordinal. ``port`` is the
        workers' port where a pod does not name one (a container port ``monarch``, or
        ``MONARCH_PORT`` in its environment).

        Raises:
            ValueError: an invalid name, count or port, or arguments that do not go
                together (a selector, rank label, labels or annotations with the wrong
                mode; both ``image_spec`` and ``pod_template``).
        """
        _check_name(name)
        if not isinstance(num_replicas, int) or isinstance(num_replicas, bool) or num_replicas < 1:
            raise ValueError(
                f"add_mesh({name!r}, num_replicas={num_replicas!r}): give a count >= 1"
            )
        if not isinstance(port, int) or not 0 < port < 65536:
            raise ValueError(f"add_mesh({name!r}, port={port!r}): give a TCP port, 1..65535")
        provisioned = image_spec is not None or pod_template is not None
        if image_spec is not None and pod_template is not None:
            raise ValueError(
                f"add_mesh({name!r}): give image_spec= (an image) or pod_template= (a full "
                "pod template), not both"
            )
        if provisioned and label_selector is not None:
            raise ValueError(
                f"add_mesh({name!r}): label_selector= is for pre-provisioned pods; a "
                "provisioned mesh's pods are found by the operator's labels"
            )
        if provisioned and pod_rank_label != POD_INDEX_LABEL:
            raise ValueError(
                f"add_mesh({name!r}): pod_rank_label= is for pre-provisioned pods; a "
                f"provisioned mesh's pods are ranked by {POD_INDEX_LABEL}"
            )
        if not provisioned and (labels is not None or annotations is not None):
            raise ValueError(
                f"add_mesh({name!r}): labels= and annotations= go on the MonarchMesh of a "
                "provisioned mesh; pass image_spec= or pod_template= too, or label the "
                "pre-provisioned pods yourself"
            )
        template: dict[str, Any] | None = None
        if image_spec is not None:
            template = _worker_pod_template(image_spec, port)
        elif pod_template is not None:
            template = _template_json(pod_template)
        self._meshes[name] = _MeshSpec(
            name=name,
            num_replicas=num_replicas,
            label_selector=label_selector or f"{APP_LABEL}={APP_VALUE},{MESH_LABEL}={name}",
            pod_rank_label=pod_rank_label,
            port=port,
            pod_template=template,
            labels=dict(labels) if labels is not None else None,
            annotations=dict(annotations) if annotations is not None else None,
        )

    # ----------------------------------------------------------------------------------
    # The API

    @contextlib.contextmanager
    def _api(self) -> Iterator[Any]:
        """A fresh API client for one operation (a job holds none)."""
        api_client = self._kubeconfig.api_client()
        try:
            yield api_client
        finally:
            api_client.close()

    def _mesh_body(self, spec: _MeshSpec) -> dict[str, Any]:
        """The MonarchMesh resource of ``spec`` (K8S-3)."""
        metadata: dict[str, Any] = {"name": spec.name, "namespace": self._namespace}
        if spec.labels is not None:
            metadata["labels"] = spec.labels
        if spec.annotations is not None:
            metadata["annotations"] = spec.annotations
        return {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": KIND,
            "metadata": metadata,
            "spec": {
                "replicas": spec.num_replicas,
                "port": spec.port,
                "podTemplate": spec.pod_template,
            },
        }

    def _ensure_secret(self, api_client: Any) -> None:
        """Create the cluster-secret Secret unless it exists: this client's
        ``MONARCH_CLUSTER_SECRET`` if set, else a random one."""
        k8s = _kubernetes()
        core = k8s.client.CoreV1Api(api_client)
        api_exception = _api_exception()
        try:
            core.read_namespaced_secret(SECRET_NAME, self._namespace)
            return
        except api_exception as e:
            if getattr(e, "status", None) != 404:
                raise
        value = os.environ.get(SECRET_ENV) or secrets.token_hex(32)
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": SECRET_NAME, "namespace": self._namespace},
            "type": "Opaque",
            "stringData": {SECRET_KEY: value},
        }
        try:
            core.create_namespaced_secret(self._namespace, body)
            logger.info("created the Secret %s/%s", self._namespace, SECRET_NAME)
        except api_exception as e:
            if getattr(e, "status", None) != 409:  # made meanwhile by someone else: fine
                raise

    def _use_cluster_secret(self, api_client: Any) -> None:
        """Make this process authenticate with the workers' secret: its own
        ``MONARCH_CLUSTER_SECRET``, else the Secret's value."""
        if os.environ.get(SECRET_ENV) or os.environ.get("MONARCH_TLS_CA"):
            return
        k8s = _kubernetes()
        core = k8s.client.CoreV1Api(api_client)
        try:
            secret = core.read_namespaced_secret(SECRET_NAME, self._namespace)
        except _api_exception() as e:
            raise RuntimeError(
                f"KubernetesJob: this client has no {SECRET_ENV} and cannot read the Secret "
                f"{self._namespace}/{SECRET_NAME} ({getattr(e, 'status', '?')} "
                f"{getattr(e, 'reason', e)}); set {SECRET_ENV} to the workers' secret, or "
                "create the Secret (see docs/kubernetes.md) and let this client read it"
            ) from None
        import base64

        encoded = (secret.data or {}).get(SECRET_KEY)
        if not encoded:
            raise RuntimeError(
                f"KubernetesJob: the Secret {self._namespace}/{SECRET_NAME} has no key "
                f"{SECRET_KEY!r}; create it with `kubectl -n {self._namespace} create secret "
                f"generic {SECRET_NAME} --from-literal={SECRET_KEY}=$(openssl rand -hex 32)`"
            )
        value = base64.b64decode(encoded).decode()
        from monarch._rust_bindings import set_cluster_secret

        # The environment too: procs this client starts inherit the mode from it.
        os.environ[SECRET_ENV] = value
        set_cluster_secret(value)

    # ----------------------------------------------------------------------------------
    # JobTrait

    def _create(self, client_script: str | None) -> None:
        _refuse_batch(self, client_script)
        if not self._meshes:
            raise ValueError(
                "KubernetesJob has no meshes: call job.add_mesh('trainers', 2) (and "
                "image_spec= to provision them) before apply() or state()"
            )
        provisioned = [m for m in self._meshes.values() if m.provisioned]
        if not provisioned:
            return
        k8s = _kubernetes()
        api_exception = _api_exception()
        with self._api() as api_client:
            self._ensure_secret(api_client)
            custom = k8s.client.CustomObjectsApi(api_client)
            for spec in provisioned:
                body = self._mesh_body(spec)
                try:
                    custom.create_namespaced_custom_object(
                        GROUP, VERSION, self._namespace, PLURAL, body
                    )
                    logger.info("created MonarchMesh %s/%s", self._namespace, spec.name)
                except api_exception as e:
                    if getattr(e, "status", None) != 409:
                        raise
                    custom.patch_namespaced_custom_object(
                        GROUP, VERSION, self._namespace, PLURAL, spec.name, body
                    )
                    logger.info("MonarchMesh %s/%s existed: patched", self._namespace, spec.name)

    def _state(self) -> JobState:
        if not self._meshes:
            raise ValueError("KubernetesJob has no meshes: call job.add_mesh(...) first")
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        with self._api() as api_client:
            self._use_cluster_secret(api_client)
            found = {
                name: _PodWatch(self, api_client, spec).wait_answering(deadline)
                for name, spec in self._meshes.items()
            }
        self._attach_gateway()
        from monarch._src.actor.workers import attach_to_workers

        meshes: dict[str, HostMesh] = {}
        for name, pods in found.items():
            meshes[name] = attach_to_workers(name=name, ca=None, workers=[p.address for p in pods])
        for name, mesh in meshes.items():
            remaining = None if deadline is None else max(deadline - time.monotonic(), 1.0)
            try:
                mesh.initialized.get(timeout=remaining)
            except Exception as e:
                where = ", ".join(f"{p.name} at {p.address}" for p in found[name])
                seen = (
                    f"are Ready but do not answer through the gateway {self._attach_to}"
                    if self._attach_to is not None
                    else "accept TCP connections but monarch cannot attach to them"
                )
                raise RuntimeError(
                    f"KubernetesJob: mesh {name!r}: the workers of pods {where} {seen}: "
                    f"{e}; check that the client and the pods share the cluster secret "
                    f"({SECRET_ENV}, Secret {self._namespace}/{SECRET_NAME}) and the pods' "
                    "logs"
                ) from e
        return JobState(meshes)

    def _attach_gateway(self) -> None:
        """Out of cluster (``attach_to``): attach this client through the gateway before
        any host mesh, with the credentials ``_use_cluster_secret`` set."""
        if self._attach_to is None:
            return
        from monarch._src.actor.gateway import attach

        logger.info("attaching this client through the gateway %s", self._attach_to)
        attach(self._attach_to)

    def _answers(self, pod: _Pod) -> bool:
        """Whether ``pod``'s worker accepts a TCP connection (K8S-1). Out of cluster the
        client cannot dial the pods: their workers' answer is monarch's attach probe
        (``HostMesh.initialized``, through the gateway), so a Ready pod counts here."""
        return self._attach_to is not None or _probe(pod, self.probe_timeout)

    def can_run(self, spec: JobTrait) -> bool:
        """Whether ``spec`` asks for the same meshes in the same namespace and cluster
        (through the same gateway), and each has all its ranks Ready and answering now
        (no waiting)."""
        if not (
            isinstance(spec, KubernetesJob)
            and type(spec) is type(self)
            and spec._namespace == self._namespace
            and spec._kubeconfig == self._kubeconfig
            and spec._attach_to == self._attach_to
            and spec._meshes == self._meshes
            and self.active
        ):
            return False
        with self._api() as api_client:
            for mesh in self._meshes.values():
                if _PodWatch(self, api_client, mesh).answering_now() is None:
                    return False
        return True

    def _kill(self) -> None:
        """Provisioned meshes: delete their MonarchMesh resources (one already gone is
        fine) and wait until their pods are gone (``kill_timeout``). Pre-provisioned
        meshes: end the monarch workers of their pods that answer (``HostMesh.shutdown``);
        the pods stay (a StatefulSet's kubelet restarts the container, with a fresh
        worker), since this job did not create them."""
        k8s = _kubernetes()
        api_exception = _api_exception()
        provisioned = [m for m in self._meshes.values() if m.provisioned]
        attached = [m for m in self._meshes.values() if not m.provisioned]
        with self._api() as api_client:
            custom = k8s.client.CustomObjectsApi(api_client)
            for spec in provisioned:
                try:
                    custom.delete_namespaced_custom_object(
                        GROUP, VERSION, self._namespace, PLURAL, spec.name
                    )
                    logger.info("deleted MonarchMesh %s/%s", self._namespace, spec.name)
                except api_exception as e:
                    if getattr(e, "status", None) != 404:
                        raise
                    logger.info("MonarchMesh %s/%s was already gone", self._namespace, spec.name)
            deadline = time.monotonic() + self.kill_timeout
            for spec in provisioned:
                _PodWatch(self, api_client, spec).wait_gone(deadline)
            workers: dict[str, list[_Pod]] = {}
            if attached:
                self._use_cluster_secret(api_client)
                for spec in attached:
                    pods = _PodWatch(self, api_client, spec).answering_pods()
                    if pods:
                        workers[spec.name] = pods
        if workers:
            self._attach_gateway()
        for name, pods in workers.items():
            from monarch._src.actor.workers import attach_to_workers

            mesh = attach_to_workers(name=name, ca=None, workers=[p.address for p in pods])
            mesh.shutdown().get(timeout=self.kill_timeout)
            logger.info("ended the workers of mesh %r (%d pods)", name, len(pods))

    def __repr__(self) -> str:
        meshes = ", ".join(
            f"{m.name}={m.num_replicas}{' (provisioned)' if m.provisioned else ''}"
            for m in self._meshes.values()
        )
        return f"KubernetesJob(namespace={self._namespace!r}, meshes: {meshes or 'none'})"


def _probe(pod: _Pod, timeout: float) -> bool:
    """Whether the worker of ``pod`` accepts a TCP connection (K8S-1)."""
    if not pod.ip:
        return False
    try:
        with socket.create_connection((pod.ip, pod.port), timeout=timeout):
            return True
    except OSError:
        return False


class _PodWatch:
    """The pods of one mesh, as a watch of the API sees them."""

    def __init__(self, job: KubernetesJob, api_client: Any, spec: _MeshSpec) -> None:
        k8s = _kubernetes()
        self.job = job
        self.spec = spec
        self.core = k8s.client.CoreV1Api(api_client)
        self.watch_cls = k8s.watch.Watch

    def _pod(self, obj: Any) -> _Pod:
        meta, status, spec = obj.metadata, obj.status, obj.spec
        labels = meta.labels or {}
        rank: int | None = None
        raw = labels.get(self.spec.pod_rank_label)
        if raw is not None:
            rank = int(raw) if str(raw).isdigit() else None
        else:  # no pod-index label (Kubernetes < 1.28): the StatefulSet ordinal
            m = _ORDINAL.match(meta.name or "")
            rank = int(m["ordinal"]) if m else None
        ready = any(
            c.type == "Ready" and c.status == "True" for c in (status and status.conditions) or []
        )
        phase = (status and status.phase) or "Pending"
        if meta.deletion_timestamp is not None:
            ready, phase = False, "Terminating"
        return _Pod(
            name=meta.name,
            rank=rank,
            ip=status and status.pod_ip,
            port=self._port(spec),
            ready=ready,
            phase=phase,
        )

    def _port(self, pod_spec: Any) -> int:
        """The worker's port: a container port named ``monarch``, else ``MONARCH_PORT``
        in a container's environment, else the mesh's port."""
        containers = (pod_spec and pod_spec.containers) or []
        for c in containers:
            for p in c.ports or []:
                if p.name == "monarch":
                    return int(p.container_port)
        for c in containers:
            for env in c.env or []:
                if env.name == "MONARCH_PORT" and env.value and env.value.isdigit():
                    return int(env.value)
        return self.spec.port

    def _list(self) -> dict[str, _Pod]:
        return self._list_at()[0]

    def _list_at(self) -> tuple[dict[str, _Pod], str | None]:
        """The mesh's pods, and the resource version to watch from."""
        listed = self.core.list_namespaced_pod(
            self.job._namespace, label_selector=self.spec.label_selector
        )
        pods = {p.metadata.name: self._pod(p) for p in listed.items}
        return pods, listed.metadata and listed.metadata.resource_version

    def _events(self, window: float, resource_version: str | None) -> Iterator[tuple[str, _Pod]]:
        """One watch request (at most ``window`` seconds) of the changes after
        ``resource_version``."""
        watch = self.watch_cls()
        seconds = max(1, math.ceil(window))
        extra = {} if resource_version is None else {"resource_version": resource_version}
        try:
            for event in watch.stream(
                self.core.list_namespaced_pod,
                self.job._namespace,
                label_selector=self.spec.label_selector,
                timeout_seconds=seconds,
                _request_timeout=(10, seconds + 10),
                **extra,
            ):
                if event["type"] == "ERROR":
                    raise RuntimeError(
                        f"KubernetesJob: the pod watch failed: {event['raw_object']}"
                    )
                if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                    yield event["type"], self._pod(event["object"])
        finally:
            watch.stop()

    def _ranked(self, pods: Mapping[str, _Pod]) -> dict[int, _Pod]:
        """The pod of each rank 0 .. N-1 that is Ready, with an IP."""
        by_rank: dict[int, _Pod] = {}
        for pod in pods.values():
            if pod.rank is None or not 0 <= pod.rank < self.spec.num_replicas:
                continue
            if pod.ready and pod.ip:
                by_rank[pod.rank] = pod
        return by_rank

    def answering_pods(self) -> list[_Pod]:
        """The Ready pods whose workers answer now, in rank order."""
        by_rank = self._ranked(self._list())
        return [by_rank[r] for r in sorted(by_rank) if self.job._answers(by_rank[r])]

    def answering_now(self) -> list[_Pod] | None:
        """Every rank's pod if all are Ready and answering now, else ``None``."""
        by_rank = self._ranked(self._list())
        if len(by_rank) != self.spec.num_replicas:
            return None
        pods = [by_rank[r] for r in range(self.spec.num_replicas)]
        return pods if all(self.job._answers(p) for p in pods) else None

    def wait_answering(self, deadline: float | None) -> list[_Pod]:
        """Watch until every rank has a Ready pod whose worker answers (K8S-1); the pods
        in rank order.

        Raises:
            RuntimeError: not within the deadline (saying what each rank lacks), or
                the watch failed.
        """
        answered: set[tuple[str, str | None]] = set()
        pods: dict[str, _Pod] = {}
        try:
            while True:
                pods, version = self._list_at()
                ready = self._answering(pods, answered)
                if ready is not None:
                    return ready
                remaining = math.inf if deadline is None else deadline - time.monotonic()
                if remaining <= 0:
                    raise self._timeout_error(pods, answered)
                # A complete set whose workers do not answer yet is probed again after a
                # short watch; otherwise only a watch event can change anything.
                complete = len(self._ranked(pods)) == self.spec.num_replicas
                window = min(remaining, 1.0 if complete else self.job.watch_window)
                for kind, pod in self._events(window, version):
                    if kind == "DELETED":
                        pods.pop(pod.name, None)
                    else:
                        pods[pod.name] = pod
                    ready = self._answering(pods, answered)
                    if ready is not None:
                        return ready
                    if deadline is not None and time.monotonic() >= deadline:
                        break
        except _api_exception() as e:
            raise RuntimeError(
                f"KubernetesJob: cannot watch the pods of mesh {self.spec.name!r} "
                f"(namespace {self.job._namespace}, selector {self.spec.label_selector}): "
                f"{getattr(e, 'status', '?')} {getattr(e, 'reason', e)}"
            ) from None

    def _answering(
        self, pods: Mapping[str, _Pod], answered: set[tuple[str, str | None]]
    ) -> list[_Pod] | None:
        by_rank = self._ranked(pods)
        if len(by_rank) != self.spec.num_replicas:
            return None
        for pod in by_rank.values():
            key = (pod.name, pod.ip)
            if key not in answered and self.job._answers(pod):
                answered.add(key)
        if all((p.name, p.ip) in answered for p in by_rank.values()):
            return [by_rank[r] for r in range(self.spec.num_replicas)]
        return None

    def _timeout_error(
        self, pods: Mapping[str, _Pod], answered: set[tuple[str, str | None]]
    ) -> RuntimeError:
        ns, sel = self.job._namespace, self.spec.label_selector
        by_rank: dict[int, list[_Pod]] = {}
        unranked = []
        for pod in pods.values():
            if pod.rank is None:
                unranked.append(pod.name)
            else:
                by_rank.setdefault(pod.rank, []).append(pod)
        lines = []
        for rank in range(self.spec.num_replicas):
            candidates = by_rank.get(rank, [])
            if not candidates:
                lines.append(f"rank {rank}: no pod")
                continue
            for pod in candidates:
                if pod.ready and pod.ip and (pod.name, pod.ip) not in answered:
                    lines.append(
                        f"rank {rank}: {pod.describe()}, but its worker at {pod.address} does "
                        "not answer"
                    )
                elif (pod.name, pod.ip) in answered:
                    lines.append(f"rank {rank}: {pod.describe()}, worker answers")
                else:
                    lines.append(f"rank {rank}: {pod.describe()}")
        if unranked:
            lines.append(
                f"pods with neither the label {self.spec.pod_rank_label!r} nor a StatefulSet "
                f"name <set>-<N>: {', '.join(sorted(unranked))}"
            )
        return RuntimeError(
            f"KubernetesJob: mesh {self.spec.name!r}: the workers of {self.spec.num_replicas} "
            f"pods were not ready within {self.job._timeout} s (namespace {ns}, selector "
            f"{sel}):\n  " + "\n  ".join(lines) + f"\ncheck `kubectl -n {ns} get pods -l {sel}` "
            "and the pods' logs (`kubectl logs`), or raise KubernetesJob(timeout=...)"
        )

    def wait_gone(self, deadline: float) -> None:
        """Watch until no pod of the mesh is left (K8S-2).

        Raises:
            RuntimeError: pods are still there at ``deadline``.
        """
        pods: dict[str, _Pod] = {}
        while True:
            pods, version = self._list_at()
            if not pods:
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError(
                    f"KubernetesJob.kill: the pods of mesh {self.spec.name!r} were still "
                    f"there {self.job.kill_timeout:g} s after its MonarchMesh was deleted: "
                    f"{', '.join(sorted(pods))}; check `kubectl -n {self.job._namespace} get "
                    f"pods -l {self.spec.label_selector}`"
                )
            for kind, pod in self._events(min(remaining, self.job.watch_window), version):
                if kind == "DELETED":
                    pods.pop(pod.name, None)
                else:
                    pods[pod.name] = pod
                if not pods:
                    return
