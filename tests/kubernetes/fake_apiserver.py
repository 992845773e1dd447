"""A small fake Kubernetes API server, with a fake operator and kubelet, for the tests.

What a cluster cannot be here (no kind, k3s or kubelet can run), this stands in for, so
that the real ``kubernetes`` client library, a real watch stream and real ``monarch
worker`` processes run end to end:

- :class:`FakeApiServer`: an HTTP server (stdlib) answering what ``KubernetesJob`` and
  the tests use: pods (list, ``?watch=true`` streaming JSON lines from a resource
  version, label selectors with ``=``, ``==``, ``!=``, ``in``, ``notin``, exists and
  ``!key``; get, create, delete), Secrets (get, create), and the MonarchMesh custom
  resource (create, get, merge-patch, delete), with real ``Status`` bodies for 404, 409
  and 422 (a MonarchMesh is validated against the shipped CRD's schema).
- :class:`FakeKubelet`: the operator (a MonarchMesh of N replicas becomes pods
  ``<name>-0`` .. ``<name>-N-1`` labelled as the MonarchMesh operator labels them) and the
  kubelet: a pod is scheduled on a free host of a :class:`Cluster` (one pod per host, or
  it stays Pending), its container command runs in that host's network namespace, with
  its ``env`` resolved (values, ``status.podIP`` and ``metadata.*`` field references,
  Secret references) and ``$(VAR)`` expanded as the kubelet does; ``python`` is this
  interpreter (there are no images). A pod is Ready once its ``tcpSocket`` readiness
  probe connects, or, like Kubernetes, as soon as its container started when it has no
  probe. Deleting a pod marks it terminating, SIGTERMs its process (SIGKILL after the
  grace period) and removes it once the process is gone. Nothing is restarted.

What this does not cover: scheduling beyond "a free host", DNS, RBAC, images, a real
kubelet's probes and restarts, admission, the API server's other semantics.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from multihost.netns import Host

GROUP, VERSION, PLURAL = "monarch.pytorch.org", "v1alpha1", "monarchmeshes"
CRD_PATH = (
    Path(__file__).resolve().parents[2] / "python/monarch/_src/job/manifests/monarchmesh-crd.yaml"
)
#: How often the fake kubelet's readiness probe tries to connect (seconds).
PROBE_PERIOD = 0.1
#: How long a deleted pod's process gets after SIGTERM, then after SIGKILL.
GRACE_SECONDS = 5.0

Obj = dict[str, Any]


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _status(code: int, reason: str, message: str, details: Obj | None = None) -> Obj:
    """A ``Status`` body as the API server sends it."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if code < 400 else "Failure",
        "message": message,
        "reason": reason,
        "details": details or {},
        "code": code,
    }


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None):
        super().__init__(message)
        self.body = _status(code, reason, message, details)


# --------------------------------------------------------------------------------------
# Label selectors

_REQ = re.compile(
    r"^\s*(?P<neg>!)?\s*(?P<key>[A-Za-z0-9_./-]+)\s*"
    r"(?:(?P<op>==|=|!=)\s*(?P<value>[A-Za-z0-9_.-]*)|\s+(?P<setop>in|notin)\s*\((?P<set>[^)]*)\))?\s*$"
)


def parse_selector(selector: str) -> list[Callable[[dict[str, str]], bool]]:
    """The requirements of a label selector, each a predicate on a pod's labels.

    Raises:
        ApiError: 400 for a selector that does not parse.
    """
    parts, depth, cur = [], 0, ""
    for ch in selector:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    reqs: list[Callable[[dict[str, str]], bool]] = []
    for part in (p for p in parts if p.strip()):
        m = _REQ.match(part)
        if m is None or (m["neg"] and (m["op"] or m["setop"])):
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {part!r}")
        key = m["key"]
        if m["neg"]:
            reqs.append(lambda labels, k=key: k not in labels)
        elif m["op"] in ("=", "=="):
            reqs.append(lambda labels, k=key, v=m["value"]: labels.get(k) == v)
        elif m["op"] == "!=":
            reqs.append(lambda labels, k=key, v=m["value"]: labels.get(k) != v)
        elif m["setop"]:
            values = {v.strip() for v in m["set"].split(",") if v.strip()}
            if m["setop"] == "in":
                reqs.append(lambda labels, k=key, vs=values: labels.get(k) in vs)
            else:
                reqs.append(lambda labels, k=key, vs=values: labels.get(k) not in vs)
        else:
            reqs.append(lambda labels, k=key: k in labels)
    return reqs


def matches(selector: str | None, labels: dict[str, str] | None) -> bool:
    return all(req(labels or {}) for req in parse_selector(selector or ""))


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _crd_validator() -> Callable[[Obj], None] | None:
    """Validates a MonarchMesh against the CRD's schema (None without jsonschema)."""
    try:
        import jsonschema
        import yaml
    except ImportError:
        return None
    crd = yaml.safe_load(CRD_PATH.read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == VERSION)
    schema = version["schema"]["openAPIV3Schema"]

    def validate(obj: Obj) -> None:
        try:
            jsonschema.validate(obj, schema)
        except jsonschema.ValidationError as e:
            raise ApiError(
                422,
                "Invalid",
                f"MonarchMesh.{GROUP} {obj.get('metadata', {}).get('name')!r} "
                f"is invalid: {e.message}",
            ) from None

    return validate


# --------------------------------------------------------------------------------------
# The server


class FakeApiServer:
    """The API server (see the module docs). Thread-safe; use as a context manager."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._cond = threading.Condition()
        self._rv = 0
        self._pods: dict[tuple[str, str], Obj] = {}
        self._meshes: dict[tuple[str, str], Obj] = {}
        self._secrets: dict[tuple[str, str], Obj] = {}
        #: Pod events, in order: (resource version, namespace, type, pod).
        self._events: list[tuple[int, str, str, Obj]] = []
        self._closed = False
        #: Every request: (method, path with query).
        self.requests: list[tuple[str, str]] = []
        #: Called (outside the lock) on changes: set by :class:`FakeKubelet`.
        self.on_pod_added: Callable[[str, str], None] = lambda ns, name: None
        self.on_pod_deleted: Callable[[str, str], None] = lambda ns, name: None
        self.on_mesh_changed: Callable[[str, str], None] = lambda ns, name: None
        self._validate = _crd_validator()
        server = ThreadingHTTPServer((host, 0), _Handler)
        server.daemon_threads = True
        server.api = self  # type: ignore[attr-defined]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="fake-apiserver")
        self._thread.daemon = True
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def write_kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        """A kubeconfig file pointing at this server (JSON is YAML)."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "fake-token"}}],
            "contexts": [
                {
                    "name": "fake",
                    "context": {"cluster": "fake", "user": "fake", "namespace": namespace},
                }
            ],
            "current-context": "fake",
        }
        path.write_text(json.dumps(config))
        return path

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> FakeApiServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the store ----------------------------------------------------------------

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _pod_event(self, namespace: str, kind: str, pod: Obj) -> None:
        self._events.append((self._rv, namespace, kind, copy.deepcopy(pod)))
        self._cond.notify_all()

    def pods(self, namespace: str, selector: str | None = None) -> list[Obj]:
        with self._cond:
            return [
                copy.deepcopy(p)
                for (ns, _), p in sorted(self._pods.items())
                if ns == namespace and matches(selector, p["metadata"].get("labels"))
            ]

    def pod(self, namespace: str, name: str) -> Obj | None:
        with self._cond:
            pod = self._pods.get((namespace, name))
            return copy.deepcopy(pod) if pod is not None else None

    def create_pod(self, namespace: str, body: Obj) -> Obj:
        name = body.get("metadata", {}).get("name")
        if not name:
            raise ApiError(422, "Invalid", "Pod is invalid: metadata.name: Required value")
        with self._cond:
            if (namespace, name) in self._pods:
                raise ApiError(
                    409,
                    "AlreadyExists",
                    f'pods "{name}" already exists',
                    {"name": name, "kind": "pods"},
                )
            pod = copy.deepcopy(body)
            pod.update(apiVersion="v1", kind="Pod")
            meta = pod.setdefault("metadata", {})
            meta.update(
                namespace=namespace,
                uid=str(uuid.uuid4()),
                creationTimestamp=_now(),
                resourceVersion=self._next_rv(),
            )
            pod.setdefault("spec", {}).setdefault("containers", [])
            pod["status"] = {"phase": "Pending", "conditions": []}
            self._pods[(namespace, name)] = pod
            self._pod_event(namespace, "ADDED", pod)
            result = copy.deepcopy(pod)
        self.on_pod_added(namespace, name)
        return result

    def update_pod(self, namespace: str, name: str, change: Callable[[Obj], None]) -> bool:
        """Apply ``change`` to the pod (a MODIFIED event); False if it is gone."""
        with self._cond:
            pod = self._pods.get((namespace, name))
            if pod is None:
                return False
            change(pod)
            pod["metadata"]["resourceVersion"] = self._next_rv()
            self._pod_event(namespace, "MODIFIED", pod)
            return True

    def delete_pod(self, namespace: str, name: str) -> Obj:
        """Mark the pod terminating; the kubelet removes it once its process is gone."""
        pod = self.pod(namespace, name)
        if pod is None:
            raise ApiError(
                404, "NotFound", f'pods "{name}" not found', {"name": name, "kind": "pods"}
            )

        def terminating(p: Obj) -> None:
            p["metadata"].setdefault("deletionTimestamp", _now())
            for c in p["status"].get("conditions", []):
                if c["type"] == "Ready":
                    c["status"] = "False"

        self.update_pod(namespace, name, terminating)
        self.on_pod_deleted(namespace, name)
        return self.pod(namespace, name) or pod

    def remove_pod(self, namespace: str, name: str) -> None:
        with self._cond:
            pod = self._pods.pop((namespace, name), None)
            if pod is not None:
                pod["metadata"]["resourceVersion"] = self._next_rv()
                self._pod_event(namespace, "DELETED", pod)

    def mesh(self, namespace: str, name: str) -> Obj | None:
        with self._cond:
            mesh = self._meshes.get((namespace, name))
            return copy.deepcopy(mesh) if mesh is not None else None

    def _mesh_not_found(self, name: str) -> ApiError:
        return ApiError(
            404,
            "NotFound",
            f'{PLURAL}.{GROUP} "{name}" not found',
            {"name": name, "group": GROUP, "kind": PLURAL},
        )

    def create_mesh(self, namespace: str, body: Obj) -> Obj:
        name = body.get("metadata", {}).get("name", "")
        if self._validate is not None:
            self._validate(body)
        with self._cond:
            if (namespace, name) in self._meshes:
                raise ApiError(
                    409,
                    "AlreadyExists",
                    f'{PLURAL}.{GROUP} "{name}" already exists',
                    {"name": name, "group": GROUP, "kind": PLURAL},
                )
            mesh = copy.deepcopy(body)
            mesh["metadata"].update(
                namespace=namespace,
                uid=str(uuid.uuid4()),
                generation=1,
                creationTimestamp=_now(),
                resourceVersion=self._next_rv(),
            )
            self._meshes[(namespace, name)] = mesh
            result = copy.deepcopy(mesh)
        self.on_mesh_changed(namespace, name)
        return result

    def patch_mesh(self, namespace: str, name: str, patch: Obj) -> Obj:
        with self._cond:
            mesh = self._meshes.get((namespace, name))
            if mesh is None:
                raise self._mesh_not_found(name)
            merged = merge_patch(mesh, patch)
            merged["metadata"]["name"] = name
            if self._validate is not None:
                self._validate(merged)
            merged["metadata"]["generation"] = mesh["metadata"].get("generation", 1) + 1
            merged["metadata"]["resourceVersion"] = self._next_rv()
            self._meshes[(namespace, name)] = merged
            result = copy.deepcopy(merged)
        self.on_mesh_changed(namespace, name)
        return result

    def delete_mesh(self, namespace: str, name: str) -> Obj:
        with self._cond:
            if self._meshes.pop((namespace, name), None) is None:
                raise self._mesh_not_found(name)
        self.on_mesh_changed(namespace, name)
        return _status(200, "", "", {"name": name, "group": GROUP, "kind": PLURAL})

    def secret(self, namespace: str, name: str) -> Obj:
        with self._cond:
            secret = self._secrets.get((namespace, name))
            if secret is None:
                raise ApiError(
                    404,
                    "NotFound",
                    f'secrets "{name}" not found',
                    {"name": name, "kind": "secrets"},
                )
            return copy.deepcopy(secret)

    def create_secret(self, namespace: str, body: Obj) -> Obj:
        name = body.get("metadata", {}).get("name", "")
        data = dict(body.get("data") or {})
        for key, value in (body.get("stringData") or {}).items():
            data[key] = base64.b64encode(value.encode()).decode()
        with self._cond:
            if (namespace, name) in self._secrets:
                raise ApiError(
                    409,
                    "AlreadyExists",
                    f'secrets "{name}" already exists',
                    {"name": name, "kind": "secrets"},
                )
            secret = {
                "apiVersion": "v1",
                "kind": "Secret",
                "type": body.get("type", "Opaque"),
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "resourceVersion": self._next_rv(),
                },
                "data": data,
            }
            self._secrets[(namespace, name)] = secret
            return copy.deepcopy(secret)

    def secret_value(self, namespace: str, name: str, key: str) -> str | None:
        with contextlib.suppress(ApiError):
            encoded = self.secret(namespace, name)["data"].get(key)
            return None if encoded is None else base64.b64decode(encoded).decode()
        return None

    # --- watches ------------------------------------------------------------------

    def watch_pods(
        self, namespace: str, selector: str | None, version: str | None, timeout: float
    ) -> Iterator[Obj]:
        """The watch events after ``version`` (all pods as ADDED first without one),
        until ``timeout`` seconds passed or the server closes."""
        deadline = time.monotonic() + timeout
        with self._cond:
            if version in (None, "", "0"):
                start = self._rv
                initial = [
                    {"type": "ADDED", "object": copy.deepcopy(p)}
                    for (ns, _), p in sorted(self._pods.items())
                    if ns == namespace and matches(selector, p["metadata"].get("labels"))
                ]
            else:
                start, initial = int(str(version)), []
        yield from initial
        seen = start
        while True:
            with self._cond:
                while not self._closed and (not self._events or self._events[-1][0] <= seen):
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return
                    self._cond.wait(remaining)
                if self._closed:
                    return
                fresh = [e for e in self._events if e[0] > seen]
                seen = fresh[-1][0]
            for _, ns, kind, pod in fresh:
                if ns == namespace and matches(selector, pod["metadata"].get("labels")):
                    yield {"type": kind, "object": pod}

    def list_body(self, namespace: str, selector: str | None) -> Obj:
        with self._cond:
            items = self.pods(namespace, selector)
            return {
                "apiVersion": "v1",
                "kind": "PodList",
                "metadata": {"resourceVersion": str(self._rv)},
                "items": items,
            }


_PODS = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods(?:/(?P<name>[^/]+))?$")
_SECRETS = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/secrets(?:/(?P<name>[^/]+))?$")
_MESHES = re.compile(
    rf"^/apis/{re.escape(GROUP)}/{VERSION}/namespaces/(?P<ns>[^/]+)/{PLURAL}(?:/(?P<name>[^/]+))?$"
)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # one request per connection (a watch: see _watch)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    @property
    def api(self) -> FakeApiServer:
        api: FakeApiServer = self.server.api  # type: ignore[attr-defined]
        return api

    def _send(self, code: int, body: Obj) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length) or b"null")

    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        self.api.requests.append((method, self.path))
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        try:
            if self._route(method, url.path, query):
                return
            self._send(404, _status(404, "NotFound", f"the server could not find {url.path}"))
        except ApiError as e:
            self._send(e.body["code"], e.body)

    def _route(self, method: str, path: str, query: dict[str, str]) -> bool:
        api = self.api
        if m := _PODS.match(path):
            ns, name = m["ns"], m["name"]
            if name is None and method == "GET" and query.get("watch") in ("true", "1"):
                self._watch(ns, query)
            elif name is None and method == "GET":
                self._send(200, api.list_body(ns, query.get("labelSelector")))
            elif name is None and method == "POST":
                self._send(201, api.create_pod(ns, self._body()))
            elif method == "GET":
                pod = api.pod(ns, name)
                if pod is None:
                    raise ApiError(404, "NotFound", f'pods "{name}" not found', {"name": name})
                self._send(200, pod)
            elif method == "DELETE":
                self._send(200, api.delete_pod(ns, name))
            else:
                return False
            return True
        if m := _SECRETS.match(path):
            ns, name = m["ns"], m["name"]
            if name is None and method == "POST":
                self._send(201, api.create_secret(ns, self._body()))
            elif name is not None and method == "GET":
                self._send(200, api.secret(ns, name))
            else:
                return False
            return True
        if m := _MESHES.match(path):
            ns, name = m["ns"], m["name"]
            if name is None and method == "POST":
                self._send(201, api.create_mesh(ns, self._body()))
            elif name is not None and method == "GET":
                mesh = api.mesh(ns, name)
                if mesh is None:
                    raise api._mesh_not_found(name)
                self._send(200, mesh)
            elif name is not None and method == "PATCH":
                kind = self.headers.get("Content-Type", "")
                if "merge-patch" not in kind:
                    raise ApiError(415, "UnsupportedMediaType", f"unsupported patch type {kind}")
                self._send(200, api.patch_mesh(ns, name, self._body()))
            elif name is not None and method == "DELETE":
                self._send(200, api.delete_mesh(ns, name))
            else:
                return False
            return True
        return False

    def _watch(self, namespace: str, query: dict[str, str]) -> None:
        selector = query.get("labelSelector")
        parse_selector(selector or "")  # a bad selector is a 400 before the stream
        timeout = float(query.get("timeoutSeconds") or 1800)
        # As the real API server streams a watch: HTTP/1.1, each event a chunk of its own.
        # The client reads a response without chunks in blocks of 64 KiB, so it would see
        # no event before the watch's end.
        self.protocol_version = "HTTP/1.1"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        with contextlib.suppress(OSError):
            for event in self.api.watch_pods(
                namespace, selector, query.get("resourceVersion"), timeout
            ):
                line = json.dumps(event).encode() + b"\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")


# --------------------------------------------------------------------------------------
# The operator and the kubelet


class _Running:
    """A pod's container process on a host."""

    def __init__(self, host: Host, popen: subprocess.Popen[bytes]) -> None:
        self.host = host
        self.popen = popen
        self.deleting = threading.Event()


class FakeKubelet:
    """The MonarchMesh operator and the kubelet of the hosts of ``cluster`` (see the
    module docs). ``close()`` ends every pod's process."""

    def __init__(self, api: FakeApiServer, hosts: list[Host], log_dir: Path) -> None:
        self.api = api
        self.hosts = list(hosts)
        self.log_dir = log_dir
        self._lock = threading.Lock()
        self._running: dict[tuple[str, str], _Running] = {}
        #: Which pod each host runs (by host name).
        self._taken: dict[str, tuple[str, str]] = {}
        self._threads: list[threading.Thread] = []
        api.on_pod_added = self._pod_added
        api.on_pod_deleted = self._pod_deleted
        api.on_mesh_changed = self._reconcile

    # --- the operator -------------------------------------------------------------

    def _reconcile(self, namespace: str, name: str) -> None:
        mesh = self.api.mesh(namespace, name)
        owned = [
            p
            for p in self.api.pods(namespace, f"monarch.pytorch.org/mesh-name={name}")
            if "deletionTimestamp" not in p["metadata"]
        ]
        replicas = mesh["spec"]["replicas"] if mesh is not None else 0
        for pod in owned:
            if int(pod["metadata"]["labels"]["apps.kubernetes.io/pod-index"]) >= replicas:
                self.api.delete_pod(namespace, pod["metadata"]["name"])
        if mesh is None:
            return
        template = mesh["spec"]["podTemplate"] or {}
        existing = {p["metadata"]["name"] for p in owned}
        for i in range(replicas):
            pod_name = f"{name}-{i}"
            if pod_name in existing:
                continue
            labels = {
                **(template.get("metadata") or {}).get("labels", {}),
                "app.kubernetes.io/name": "monarch-worker",
                "monarch.pytorch.org/mesh-name": name,
                "apps.kubernetes.io/pod-index": str(i),
                "statefulset.kubernetes.io/pod-name": pod_name,
            }
            with contextlib.suppress(ApiError):
                self.api.create_pod(
                    namespace,
                    {
                        "metadata": {
                            "name": pod_name,
                            "labels": labels,
                            "ownerReferences": [
                                {
                                    "apiVersion": "apps/v1",
                                    "kind": "StatefulSet",
                                    "name": name,
                                    "uid": mesh["metadata"]["uid"],
                                    "controller": True,
                                }
                            ],
                        },
                        "spec": copy.deepcopy(template.get("spec") or {}),
                    },
                )

    # --- the kubelet --------------------------------------------------------------

    def _spawn(self, target: Callable[..., None], *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _pod_added(self, namespace: str, name: str) -> None:
        self._spawn(self._start, namespace, name)

    def _pod_deleted(self, namespace: str, name: str) -> None:
        self._spawn(self._stop, namespace, name)

    def _free_host(self, key: tuple[str, str]) -> Host | None:
        """Reserve a host no pod runs on for the pod ``key``."""
        with self._lock:
            for host in self.hosts:
                if self._taken.setdefault(host.name, key) == key:
                    return host
        return None

    def _release(self, key: tuple[str, str]) -> None:
        with self._lock:
            for name in [n for n, k in self._taken.items() if k == key]:
                del self._taken[name]

    def _env(self, namespace: str, pod: Obj, container: Obj, host: Host) -> dict[str, str]:
        fields = {
            "status.podIP": host.ip,
            "status.hostIP": host.ip,
            "metadata.name": pod["metadata"]["name"],
            "metadata.namespace": namespace,
        }
        env: dict[str, str] = {}
        for var in container.get("env") or []:
            source = var.get("valueFrom") or {}
            if "value" in var:
                value = _expand(str(var["value"]), env)
            elif "fieldRef" in source:
                value = fields[source["fieldRef"]["fieldPath"]]
            elif "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                found = self.api.secret_value(namespace, ref["name"], ref["key"])
                if found is None:
                    raise LookupError(f"secret {ref['name']!r} (key {ref['key']!r}) not found")
                value = found
            else:
                value = ""
            env[var["name"]] = value
        return env

    def _start(self, namespace: str, name: str) -> None:
        key = (namespace, name)
        pod = self.api.pod(namespace, name)
        if pod is None or not pod["spec"].get("containers"):
            return
        host = self._free_host(key)
        if host is None:
            self.api.update_pod(namespace, name, lambda p: _condition(p, "PodScheduled", False))
            return  # unschedulable: stays Pending
        container = pod["spec"]["containers"][0]
        try:
            pod_env = self._env(namespace, pod, container, host)
        except LookupError as e:
            self._release(key)
            reason = str(e)
            self.api.update_pod(
                namespace,
                name,
                lambda p: p["status"].update(reason="CreateContainerConfigError", message=reason),
            )
            return
        argv = [
            _expand(a, pod_env)
            for a in (container.get("command") or []) + (container.get("args") or [])
        ]
        if argv and argv[0] in ("python", "python3"):
            argv[0] = sys.executable
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("MONARCH_CLUSTER", "MONARCH_TLS"))
        }
        env.update(pod_env)
        log = self.log_dir / f"{namespace}-{name}.log"
        if self.api.pod(namespace, name) is None:  # deleted meanwhile
            self._release(key)
            return
        with self._lock:  # never held while taking the API's lock (lock order)
            if key in self._running:
                return
            with open(log, "ab") as out:
                popen = host.popen(
                    argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
                )
            running = _Running(host, popen)
            self._running[key] = running
        probe = container.get("readinessProbe")

        def started(p: Obj) -> None:
            p["spec"]["nodeName"] = host.name
            p["status"].update(
                phase="Running", podIP=host.ip, hostIP=host.ip, podIPs=[{"ip": host.ip}]
            )
            _condition(p, "PodScheduled", True)
            _condition(p, "Ready", probe is None)  # no probe: Ready once started

        self.api.update_pod(namespace, name, started)
        if probe is not None:
            port = _probe_port(container, probe)
            while not running.deleting.is_set() and popen.poll() is None:
                with contextlib.suppress(OSError):
                    with socket.create_connection((host.ip, port), timeout=1):
                        self.api.update_pod(namespace, name, lambda p: _condition(p, "Ready", True))
                        break
                running.deleting.wait(PROBE_PERIOD)  # a probe's period: nothing to wait on
        popen.wait()
        if not running.deleting.is_set():  # exited on its own: the pod failed
            code = popen.returncode
            self.api.update_pod(
                namespace,
                name,
                lambda p: (
                    p["status"].update(phase="Failed" if code else "Succeeded"),
                    _condition(p, "Ready", False),
                ),
            )

    def _stop(self, namespace: str, name: str) -> None:
        key = (namespace, name)
        with self._lock:
            running = self._running.get(key)
        if running is not None:
            running.deleting.set()
            _terminate(running.popen)
            with self._lock:
                self._running.pop(key, None)
        self._release(key)
        self.api.remove_pod(namespace, name)

    def processes(self) -> list[subprocess.Popen[bytes]]:
        with self._lock:
            return [r.popen for r in self._running.values()]

    def close(self) -> None:
        """End every pod's process, and the kubelet's threads."""
        with self._lock:
            running = list(self._running.items())
        for _, r in running:
            r.deleting.set()
            _terminate(r.popen)
        with self._lock:
            self._running.clear()
            self._taken.clear()
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout=GRACE_SECONDS * 2 + 5)


def _terminate(popen: subprocess.Popen[bytes]) -> None:
    if popen.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            popen.send_signal(signal.SIGTERM)
        try:
            popen.wait(GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait(GRACE_SECONDS)


def _condition(pod: Obj, kind: str, status: bool) -> None:
    conditions = pod["status"].setdefault("conditions", [])
    for c in conditions:
        if c["type"] == kind:
            c["status"] = "True" if status else "False"
            return
    conditions.append(
        {"type": kind, "status": "True" if status else "False", "lastTransitionTime": _now()}
    )


def _expand(text: str, env: dict[str, str]) -> str:
    """``$(VAR)`` expansion as the kubelet does it (``$$`` escapes; unknown stays)."""
    return re.sub(
        r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
        lambda m: "$" if m[0] == "$$" else env.get(m[1], m[0]),
        text,
    )


def _probe_port(container: Obj, probe: Obj) -> int:
    port = probe["tcpSocket"]["port"]
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for p in container.get("ports") or []:
        if p.get("name") == port:
            return int(p["containerPort"])
    raise ValueError(f"readiness probe names an unknown port {port!r}")


class EventWaiter:
    """Waits for a condition on the server's state, re-checked on each change."""

    def __init__(self, api: FakeApiServer) -> None:
        self.api = api

    def wait(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        with self.api._cond:
            while True:
                # The predicate reads through the API's lock, which is reentrant here.
                if predicate():
                    return
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"fake cluster: {what} did not happen within {timeout:g} s")
                self.api._cond.wait(remaining)
