"""monarch.spmd: the torch elastic environment of a mesh, SPMDActor.main, DDP over gloo.

The two-host shape uses a ``ProcessJob`` (two real local workers, shared by the tests of
this module); ``examples/ddp_spmd.py`` is imported for the DDP tests.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import monarch.spmd
from monarch._src.spmd.actor import torch_elastic_env
from monarch.actor import Actor, ActorError, HostMesh, ProcMesh, endpoint, this_host
from monarch.job import ProcessJob
from monarch.spmd import SPMDActor, setup_torch_elastic_env, setup_torch_elastic_env_async
from monarch.tools.network import AddrType, get_consistent_sockaddr, get_ipaddr, get_sockaddr

ROOT = Path(__file__).resolve().parents[2]

KEYS = [
    "RANK", "ROLE_RANK", "LOCAL_RANK", "WORLD_SIZE", "ROLE_WORLD_SIZE", "LOCAL_WORLD_SIZE",
    "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
]  # fmt: skip


class EnvProbe(Actor):
    @endpoint
    def env(self, names: list[str]) -> dict[str, str | None]:
        return {name: os.environ.get(name) for name in names}


def expected(rank: int, local: int, world: int, local_world: int, port: int) -> dict[str, str]:
    return {
        "RANK": str(rank),
        "ROLE_RANK": str(rank),
        "LOCAL_RANK": str(local),
        "WORLD_SIZE": str(world),
        "ROLE_WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(local_world),
        "GROUP_RANK": str(rank // local_world),
        "GROUP_WORLD_SIZE": str(-(-world // local_world)),
        "ROLE_NAME": "rank",
        "MASTER_ADDR": "master.example",
        "MASTER_PORT": str(port),
    }


def envs_of(procs: ProcMesh, names: list[str] = KEYS) -> list[tuple[dict[str, int], Any]]:
    probe = procs.spawn("probe", EnvProbe)
    return [(dict(point), env) for point, env in probe.env.call(names).get(timeout=60)]


@pytest.fixture(scope="module")
def two_hosts() -> Iterator[HostMesh]:
    """A {"hosts": 2} mesh of real local workers, for this module's tests."""
    job = ProcessJob({"hosts": 2})
    try:
        yield job.state(cached_path=None).hosts
    finally:
        job.kill()


# --- the table, without procs ---------------------------------------------------------


def test_exports() -> None:
    assert monarch.spmd.__all__ == [
        "SPMDActor",
        "setup_torch_elastic_env",
        "setup_torch_elastic_env_async",
    ]


@pytest.mark.timeout(60)
def test_import_does_not_import_torch() -> None:
    code = "import sys, monarch.spmd; assert 'torch' not in sys.modules, sorted(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=50)


@pytest.mark.parametrize(
    ("labels", "sizes", "coords", "want"),
    [
        (["gpus"], [4], [3], (3, 3, 4, 4, 0, 1)),
        (["hosts", "gpus"], [2, 4], [1, 2], (6, 2, 8, 4, 1, 2)),
        (["dc", "hosts", "gpus"], [2, 3, 2], [1, 0, 1], (7, 1, 12, 2, 3, 6)),
        (["hosts", "gpus"], [3, 1], [2, 0], (2, 0, 3, 1, 2, 3)),
        ([], [], [], (0, 0, 1, 1, 0, 1)),
    ],
)
def test_table(
    labels: list[str], sizes: list[int], coords: list[int], want: tuple[int, ...]
) -> None:
    env = torch_elastic_env(labels, sizes, coords, "m", 7)
    rank, local, world, local_world, group, groups = want
    assert env == {
        **expected(rank, local, world, local_world, 7),
        "MASTER_ADDR": "m",
        "GROUP_RANK": str(group),
        "GROUP_WORLD_SIZE": str(groups),
    }


def test_network_addresses() -> None:
    assert get_ipaddr("127.0.0.1", 80, AddrType.IPv4) == "127.0.0.1"
    assert get_sockaddr("127.0.0.1", 80) == "127.0.0.1:80"
    with pytest.raises(ValueError, match="AddrType"):
        get_ipaddr("127.0.0.1", 80, "IPv4")  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="cannot resolve"):
        get_ipaddr("no-such-host.invalid", 80, AddrType.IPv4)


def _addrinfo(*ips: str, port: int = 8080) -> list[Any]:
    """A ``socket.getaddrinfo`` answer holding ``ips``, in this order."""
    return [
        (socket.AF_INET6, socket.SOCK_STREAM, 6, "", (ip, port, 0, 0))
        if ":" in ip
        else (socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port))
        for ip in ips
    ]


@pytest.mark.parametrize(
    ("ips", "expected"),
    [
        # An IPv6 address only this host sees (its /etc/hosts) does not change the answer.
        (["2a03:83e4::cba7", "10.130.53.206"], "10.130.53.206:8080"),
        (["10.130.53.206"], "10.130.53.206:8080"),
        # The resolver's order does not decide: the lowest address does.
        (["10.130.53.206", "10.130.53.7"], "10.130.53.7:8080"),
        (["10.130.53.7", "10.130.53.206"], "10.130.53.7:8080"),
        (["2a03:83e4::cba7"], "[2a03:83e4::cba7]:8080"),
        # Unreachable by peers: dropped.
        (["127.0.1.1", "::1", "fe80::1%eth0", "169.254.1.1", "10.0.0.9"], "10.0.0.9:8080"),
    ],
)
def test_consistent_sockaddr_is_what_every_host_agrees_on(
    ips: list[str], expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: _addrinfo(*ips))
    assert get_consistent_sockaddr("node-0", 8080) == expected


def test_consistent_sockaddr_refuses_loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: _addrinfo("127.0.0.1"))
    with pytest.raises(RuntimeError, match="routable address"):
        get_consistent_sockaddr("node-0", 8080)
    with pytest.raises(RuntimeError, match="cannot resolve"):
        monkeypatch.undo()
        get_consistent_sockaddr("no-such-host.invalid", 80)


# --- the environment of real meshes ------------------------------------------------------


@pytest.mark.timeout(90)
def test_environment_of_a_gpus_4_mesh() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 4})
    try:
        setup_torch_elastic_env(procs, "master.example", 1234)
        got = envs_of(procs)
        assert got == [({"gpus": g}, expected(g, g, 4, 4, 1234)) for g in range(4)]
    finally:
        procs.stop().get(timeout=30)


@pytest.mark.timeout(120)
def test_environment_of_a_two_host_mesh(two_hosts: HostMesh) -> None:
    procs = two_hosts.spawn_procs(per_host={"gpus": 2})
    try:
        setup_torch_elastic_env(procs, "master.example", 4321)
        got = envs_of(procs)
        assert got == [
            ({"hosts": h, "gpus": g}, expected(2 * h + g, g, 4, 2, 4321))
            for h in range(2)
            for g in range(2)
        ]
    finally:
        procs.stop().get(timeout=30)


@pytest.mark.timeout(90)
def test_the_origin_picks_the_master_address() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        setup_torch_elastic_env(procs, use_ipaddr=AddrType.IPv4)
        envs = [env for _, env in envs_of(procs, ["MASTER_ADDR", "MASTER_PORT", "RANK"])]
        assert [e["RANK"] for e in envs] == ["0", "1"]
        assert envs[0]["MASTER_ADDR"] == envs[1]["MASTER_ADDR"]
        assert envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"]
        socket.inet_aton(str(envs[0]["MASTER_ADDR"]))  # an IPv4 address
        assert 0 < int(str(envs[0]["MASTER_PORT"])) < 65536
        # By hostname when no address family is asked for.
        spmd = procs.spawn("_SPMDActor", SPMDActor)
        host, port = spmd.slice(gpus=1).get_host_port.call_one(None).get(timeout=30)
        assert host == socket.gethostname() and isinstance(port, int)
    finally:
        procs.stop().get(timeout=30)


@pytest.mark.timeout(90)
def test_async_setup() -> None:
    import asyncio

    procs = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 1})

    async def run() -> None:
        await setup_torch_elastic_env_async(procs, "master.example", 99)

    try:
        asyncio.run(run())
        got = envs_of(procs)
        assert got == [({"hosts": h, "gpus": 0}, expected(h, 0, 2, 1, 99)) for h in range(2)]
    finally:
        procs.stop().get(timeout=30)


class Ranked(SPMDActor):
    """A subclass that reads the table's numbers as attributes."""

    @endpoint
    def numbers(self) -> tuple[int, ...]:
        return (
            self.rank,
            self.local_rank,
            self.world_size,
            self.local_world_size,
            self.group_rank,
            self.group_world_size,
        )


@pytest.mark.timeout(90)
def test_a_subclass_sees_its_numbers() -> None:
    procs = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 3})
    try:
        numbers = procs.spawn("ranked", Ranked).numbers.call().get(timeout=60)
        assert numbers.values() == [(3 * h + g, g, 6, 3, h, 2) for h in range(2) for g in range(3)]
    finally:
        procs.stop().get(timeout=30)


def test_address_and_port_go_together() -> None:
    procs: Any = object()  # never used: the arguments are checked first
    with pytest.raises(AssertionError, match="both"):
        setup_torch_elastic_env(procs, master_addr="host")
    with pytest.raises(AssertionError, match="both"):
        setup_torch_elastic_env(procs, master_port=1)


# --- SPMDActor.main ----------------------------------------------------------------------

SCRIPT = """
import json, os, sys
out = os.environ["SPMD_TEST_OUT"]
with open(os.path.join(out, f"rank-{os.environ['RANK']}.json"), "w") as f:
    json.dump({"argv": sys.argv, "name": __name__,
               "env": {k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE",
                                                    "MASTER_ADDR", "MASTER_PORT")}}, f)
"""


@pytest.fixture
def spmd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Two SPMDActors whose procs can import the module ``spmd_script`` of tmp_path."""
    (tmp_path / "spmd_script.py").write_text(SCRIPT)
    monkeypatch.syspath_prepend(str(tmp_path))  # the procs' PYTHONPATH
    procs = this_host().spawn_procs(
        per_host={"gpus": 2}, env={"SPMD_TEST_OUT": str(tmp_path)}, name="spmd"
    )
    try:
        yield procs.spawn("_SPMDActor", SPMDActor)
    finally:
        procs.stop().get(timeout=30)


def outputs(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(2)]


@pytest.mark.timeout(90)
def test_main_runs_a_script(spmd: Any, tmp_path: Path) -> None:
    script = str(tmp_path / "spmd_script.py")
    done = spmd.main.call("localhost", 5555, [script, "--lr", "0.1"]).get(timeout=60)
    assert done.values() == [True, True]
    for rank, out in enumerate(outputs(tmp_path)):
        assert out["argv"] == [script, "--lr", "0.1"]
        assert out["name"] == "__main__"
        assert out["env"] == {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "localhost",
            "MASTER_PORT": "5555",
        }


@pytest.mark.timeout(90)
def test_main_runs_a_module(spmd: Any, tmp_path: Path) -> None:
    done = spmd.main.call("localhost", 5556, ["-m", "spmd_script", "a", "b"]).get(timeout=60)
    assert done.values() == [True, True]
    for out in outputs(tmp_path):
        assert out["argv"][1:] == ["a", "b"]
        assert out["argv"][0].endswith("spmd_script.py")
        assert out["name"] == "__main__" and out["env"]["MASTER_PORT"] == "5556"


@pytest.mark.timeout(90)
def test_main_errors(spmd: Any, tmp_path: Path) -> None:
    with pytest.raises(ActorError, match="no script or module") as info:
        spmd.main.call("localhost", 1, []).get(timeout=60)
    assert isinstance(info.value.exception, ValueError)
    with pytest.raises(ActorError, match="no script or module"):
        spmd.main.call("localhost", 1, ["-m"]).get(timeout=60)
    # sys.exit(0) is success; a non-zero status or an exception is an error, and the
    # actors stay usable.
    (tmp_path / "exit0.py").write_text("import sys\nsys.exit(0)\n")
    (tmp_path / "exit3.py").write_text("import sys\nsys.exit(3)\n")
    (tmp_path / "boom.py").write_text("raise KeyError('boom')\n")
    ok = spmd.main.call("localhost", 1, [str(tmp_path / "exit0.py")]).get(timeout=60)
    assert ok.values() == [True, True]
    with pytest.raises(ActorError, match="exited with status 3"):
        spmd.main.call("localhost", 1, [str(tmp_path / "exit3.py")]).get(timeout=60)
    with pytest.raises(ActorError, match="boom"):
        spmd.main.call("localhost", 1, [str(tmp_path / "boom.py")]).get(timeout=60)
    script = str(tmp_path / "spmd_script.py")
    assert spmd.main.call("localhost", 1, [script]).get(timeout=60).values() == [True, True]


# --- DDP over gloo -----------------------------------------------------------------------


@pytest.fixture
def ddp_example(monkeypatch: pytest.MonkeyPatch) -> Any:
    """examples/ddp_spmd.py, importable here and in the procs."""
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    import ddp_spmd

    return ddp_spmd


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world_size", [2, 4])
def test_ddp_converges_identically_on_every_rank(ddp_example: Any, world_size: int) -> None:
    params = ddp_example.train(world_size, steps=4, verbose=False)
    assert len(params) == world_size
    assert all(p == params[0] for p in params[1:]), "the replicas diverged"
    # Training moved the weights away from the shared initial ones.
    import torch

    torch.manual_seed(0)
    initial = [v for p in ddp_example.ToyModel().parameters() for v in p.flatten().tolist()]
    assert len(initial) == len(params[0]) and initial != params[0]


@pytest.mark.timeout(180)
def test_the_ddp_example_runs() -> None:
    example = str(ROOT / "examples" / "ddp_spmd.py")
    out = subprocess.run(
        [sys.executable, example, "--world-sizes", "2", "--steps", "2"],
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    assert "world 2 step 2: rank 0 loss=" in out.stdout and "rank 1 loss=" in out.stdout
    assert "world 2: every rank has the same parameters: True" in out.stdout
