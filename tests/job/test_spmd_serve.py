"""``monarch.job.spmd``: ``serve`` of a torchrun command line and ``SPMDJob.run_spmd``
(invariants SPMD-1 and SPMD-2 of ``monarch._src.job.spmd``).

The parsing and scheduler tests need no runtime. The end-to-end tests run real worker
processes (``scheduler="local"``, a ``ProcessJob``): the DDP script of docs/spmd.md as a
torchrun script (``spmd_ddp_script.py``), a module run with ``-m``, two hosts, a rank
that raises and one that exits with a status. The multi-host run over network-namespace
hosts is tests/multihost/test_spmd_hosts.py.
"""

from __future__ import annotations

import json
import os
import textwrap
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import monarch.job
import monarch.job.spmd
from monarch._src.job import spmd as spmd_impl
from monarch.job import ProcessJob
from monarch.job.spmd import SPMDJob, SPMDRunError, serve

HERE = Path(__file__).resolve().parent
DDP_SCRIPT = HERE / "spmd_ddp_script.py"

parse = spmd_impl.parse_torchrun


# --- exports ------------------------------------------------------------------------


def test_upstream_names() -> None:
    assert monarch.job.spmd.__all__ == ["SPMDJob", "SPMDRunError", "job_load", "job_loads", "serve"]
    assert monarch.job.serve is serve and monarch.job.SPMDJob is SPMDJob
    assert monarch.job.SPMDRunError is SPMDRunError
    assert monarch.job.spmd.job_load is monarch.job.job_load


# --- the command line ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "nnodes", "nproc", "script_args"),
    [
        (
            ["torchrun", "--nnodes=1", "--nproc-per-node=2", "train.py", "--lr", "0.1"],
            1,
            2,
            ("train.py", "--lr", "0.1"),
        ),
        (
            "torchrun --nnodes 2 --nproc_per_node 4 -m pkg.train --nnodes=9 -m x",
            2,
            4,
            ("-m", "pkg.train", "--nnodes=9", "-m", "x"),
        ),
        (["torchrun", "--standalone", "--nproc-per-node=8", "t.py"], 1, 8, ("t.py",)),
        (["/opt/venv/bin/torchrun", "--nnodes=3:3", "t.py"], 3, 1, ("t.py",)),
        (
            ["python", "-m", "torch.distributed.run", "--nproc-per-node=2", "t.py", "-x"],
            1,
            2,
            ("t.py", "-x"),
        ),
        (["python3", "-m", "torchrun", "--nproc-per-node", "2", "t.py"], 1, 2, ("t.py",)),
        (["python", "train.py", "--steps", "3"], 1, 1, ("train.py", "--steps", "3")),
        (["python3.11", "-m", "pkg.train", "-v"], 1, 1, ("-m", "pkg.train", "-v")),
        (
            [
                "torchrun",
                "--nnodes=2",
                "--nproc-per-node=2",
                "--rdzv-backend=c10d",
                "--rdzv_endpoint=$MASTER_ADDR:29500",
                "--rdzv-id",
                "42",
                "--max-restarts=0",
                "--master-addr=node0",
                "--master_port=29500",
                "--node-rank=0",
                "--log-dir",
                "/tmp/logs",
                "-r",
                "3",
                "--tee=3",
                "--local-ranks-filter=0",
                "--run-path",
                "--role=trainer",
                "--monitor-interval=1",
                "--start-method=fork",
                "train.py",
            ],
            2,
            2,
            ("train.py",),
        ),
    ],
)
def test_torchrun_command_lines(
    command: Any, nnodes: int, nproc: int, script_args: tuple[str, ...]
) -> None:
    t = parse(command)
    assert (t.nnodes, t.nproc_per_node, t.script_args) == (nnodes, nproc, script_args)


def test_the_rdzv_id_is_the_run_id() -> None:
    assert parse(["torchrun", "--rdzv-id=42", "t.py"]).run_id == "42"
    assert parse(["torchrun", "t.py"]).run_id == "none"


@pytest.mark.parametrize(
    ("command", "error"),
    [
        ([], "the command is empty"),
        (["train.py", "--lr", "1"], "'train.py --lr 1' is not a torchrun command"),
        (["bash", "run.sh"], "is not a torchrun command; expected it to start with 'torchrun'"),
        (
            ["torchrun", "--nprocs=2", "t.py"],
            "unknown torchrun flag(s) --nprocs=2 in 'torchrun --nprocs=2 t.py'",
        ),
        (["torchrun", "--gpus", "2", "t.py"], "unknown torchrun flag(s) --gpus"),
        (["torchrun", "--nproc-per-node=2"], "names no script"),
        (
            ["torchrun", "--nnodes=1:4", "t.py"],
            "--nnodes=1:4 in 'torchrun --nnodes=1:4 t.py' is an elastic range",
        ),
        (["torchrun", "--nnodes=0", "t.py"], "not a positive number of nodes"),
        (["torchrun", "--nproc-per-node=gpu", "t.py"], "a device count torchrun detects"),
        (["torchrun", "--nproc-per-node=two", "t.py"], "not a positive number of processes"),
        (["torchrun", "--no-python", "t.sh"], "--no-python"),
        (["torchrun", "--standalone", "--nnodes=2", "t.py"], "standalone is one node"),
        (["torchrun", "--help"], "unknown torchrun flag(s) --help"),
    ],
)
def test_bad_command_lines_say_what_is_wrong(command: Any, error: str) -> None:
    with pytest.raises(ValueError) as info:
        parse(command)
    assert error in str(info.value)
    assert str(info.value).startswith("serve: ")
    assert "expected" in str(info.value)


def test_a_command_that_is_not_text() -> None:
    with pytest.raises(TypeError, match="expected a torchrun command as a list of str"):
        parse(["torchrun", 3])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="or a torchx AppDef"):
        serve(42)


def test_max_restarts_warns_that_nothing_restarts() -> None:
    with pytest.warns(UserWarning, match="--max-restarts=3 has no effect"):
        parse(["torchrun", "--max-restarts=3", "t.py"])


# --- schedulers ---------------------------------------------------------------------


def test_unknown_scheduler_and_cfg_keys() -> None:
    with pytest.raises(ValueError, match="unknown scheduler 'mast_conda'; expected one of 'local'"):
        serve(["torchrun", "t.py"], scheduler="mast_conda")
    with pytest.raises(ValueError, match="'log_dir' are not known for scheduler 'local'"):
        serve(["torchrun", "t.py"], scheduler="local", scheduler_cfg={"log_dir": "/tmp"})
    with pytest.raises(ValueError, match="'partitoin' are not known for scheduler 'slurm'"):
        spmd_impl._make_job("slurm", {"partitoin": "gpu"}, 2)


def test_local_is_a_process_job_of_nnodes_workers() -> None:
    for name in ("local", "local_cwd"):
        job = spmd_impl._make_job(name, {}, 3)
        assert isinstance(job, ProcessJob) and job._meshes == {"workers": 3}


def test_slurm_cfg_maps_to_slurm_job(monkeypatch: pytest.MonkeyPatch) -> None:
    from monarch._src.job import slurm

    monkeypatch.setattr(slurm, "_use_tcp", lambda: None)  # no transport change here
    cfg = {
        "partition": "gpu",
        "time": "01:00:00",
        "job_dir": "/shared/logs",
        "constraint": "a100",
        "mail-user": "me@example.com",
        "python_exe": "/shared/venv/bin/python",
        "gpus_per_node": 8,
        "slurm_args": ["--reservation=r"],
        "nomem": True,
    }
    job = spmd_impl._make_job("slurm", cfg, 2)
    assert isinstance(job, slurm.SlurmJob)
    assert job._meshes == {"workers": 2}
    assert job._partition == "gpu" and job._time_limit == "01:00:00"
    assert job._log_dir == "/shared/logs" and job._python_exe == "/shared/venv/bin/python"
    assert job._gpus_per_node == 8 and job._ntasks_per_node == 1
    assert job._slurm_args == (
        "--constraint=a100",
        "--mail-user=me@example.com",
        "--reservation=r",
    )
    with pytest.raises(ValueError, match="gives both 'time' and 'time_limit'"):
        spmd_impl._make_job("slurm", {"time": "1:00", "time_limit": "2:00"}, 1)


def test_kubernetes_cfg_maps_to_kubernetes_job() -> None:
    pytest.importorskip("kubernetes")
    from monarch._src.job.kubernetes import ImageSpec, KubernetesJob

    job = spmd_impl._make_job("kubernetes", {"namespace": "monarch", "timeout": 60}, 2)
    assert isinstance(job, KubernetesJob)
    assert job._namespace == "monarch" and job._timeout == 60
    (mesh,) = job._meshes.values()
    assert (mesh.name, mesh.num_replicas, mesh.pod_template) == ("workers", 2, None)
    assert mesh.label_selector.endswith("monarch.pytorch.org/mesh-name=workers")

    image = "ghcr.io/example/monarch:1"
    cfg = {"mesh_name": "trainers", "image": image, "resources": {"nvidia.com/gpu": 8}}
    job = spmd_impl._make_job("kubernetes", cfg, 4)
    assert isinstance(job, KubernetesJob) and job._namespace == "default"
    (mesh,) = job._meshes.values()
    assert (mesh.name, mesh.num_replicas) == ("trainers", 4)
    assert mesh.pod_template is not None
    container = mesh.pod_template["spec"]["containers"][0]
    assert container["image"] == image
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert ImageSpec(image).image == image
    with pytest.raises(ValueError, match="'resources' go with 'image'"):
        spmd_impl._make_job("kubernetes", {"resources": {"cpu": 1}}, 1)


def test_an_appdef_role_gives_command_replicas_and_env() -> None:
    role = types.SimpleNamespace(
        entrypoint="workspace/entrypoint.sh",
        args=["torchrun", "--nproc-per-node=4", "-m", "train", "--lr", "0.001"],
        num_replicas=2,
        env={"NCCL_DEBUG": "INFO"},
    )
    command, replicas, env = spmd_impl._command_of(types.SimpleNamespace(roles=[role]))
    assert command == role.args and replicas == 2 and env == {"NCCL_DEBUG": "INFO"}
    role2 = types.SimpleNamespace(entrypoint="torchrun", args=["t.py"], num_replicas=1, env=None)
    assert spmd_impl._command_of(types.SimpleNamespace(roles=[role2]))[0] == ["torchrun", "t.py"]
    with pytest.raises(ValueError, match="the AppDef has 2 roles; expected exactly one"):
        spmd_impl._command_of(types.SimpleNamespace(roles=[role, role2]))
    role3 = types.SimpleNamespace(
        entrypoint="torchrun", args=["--nnodes=3", "t.py"], num_replicas=2, env=None
    )
    with pytest.raises(ValueError, match="num_replicas=2 but its command says --nnodes=3"):
        serve(types.SimpleNamespace(roles=[role3]))
    # num_replicas is --nnodes where the command has none.
    with_nnodes = spmd_impl._with_nnodes
    command = ["torchrun", "--nproc-per-node=4", "-m", "train", "--nnodes", "7"]
    assert parse(with_nnodes(command, parse(command), 2)).nnodes == 2
    command = ["python", "-m", "torch.distributed.run", "t.py"]
    assert with_nnodes(command, parse(command), 3) == [*command[:3], "--nnodes=3", "t.py"]
    assert with_nnodes(["python", "-m", "train"], parse(["python", "-m", "train"]), 2) == [
        "torchrun",
        "--nnodes=2",
        "-m",
        "train",
    ]


def test_proc_addresses() -> None:
    assert spmd_impl._proc_address("anon-0@tcp:10.1.0.11:36275") == "10.1.0.11"
    assert spmd_impl._proc_address("anon-0@tcp:[2001:db8::5]:80") == "2001:db8::5"
    assert spmd_impl._proc_address("anon-0@unix:/tmp/p.sock") is None
    assert spmd_impl._proc_address("anon-0@local:3") is None


# --- end to end, on local worker processes ------------------------------------------


@pytest.fixture
def quick_stop(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """Workers that stop a blocked proc after 2 s (not 10), in a fresh working
    directory; the directory."""
    monkeypatch.setenv("HYPERACTOR_STOP_ACTOR_TIMEOUT", "2s")
    monkeypatch.chdir(tmp_path)
    yield tmp_path


def _ranks(out: Path, world: int) -> list[dict[str, Any]]:
    files = sorted(out.glob("rank-*.json"))
    assert [f.name for f in files] == [f"rank-{r}.json" for r in range(world)], files
    return [json.loads(f.read_text()) for f in files]


@pytest.mark.timeout(180)
def test_the_ddp_script_runs_on_every_rank(quick_stop: Path) -> None:
    """serve() + run_spmd() run the torchrun DDP script on 2 ranks, with torchrun's
    environment and the script's arguments; every rank ends with the same parameters."""
    pytest.importorskip("torch")
    out = quick_stop / "out"
    out.mkdir()
    command = [
        "torchrun",
        "--nnodes=1",
        "--nproc-per-node=2",
        str(DDP_SCRIPT),
        "--steps",
        "3",
        "--out",
        str(out),
    ]
    start = time.monotonic()
    job = serve(command, scheduler="local")
    try:
        assert job.active and (job.nnodes, job.nproc_per_node) == (1, 2)
        assert not (quick_stop / ".monarch").exists()  # a local job is not saved
        served = time.monotonic()
        job.run_spmd(timeout=150)
        ran = time.monotonic()
        first = _ranks(out, 2)
        for rank, record in enumerate(first):
            assert record["same"] is True
            assert record["argv"] == [str(DDP_SCRIPT), "--steps", "3", "--out", str(out)]
            env = record["env"]
            assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == (
                str(rank),
                str(rank),
                "2",
            )
            assert env["MASTER_ADDR"] == "127.0.0.1" and env["TORCHELASTIC_RUN_ID"] == "none"
            assert len(record["losses"]) == 3
        assert first[0]["params"] == first[1]["params"]
        assert first[0]["losses"] != first[1]["losses"]  # each rank its own data
        print(f"serve {served - start:.1f} s, run_spmd {ran - served:.1f} s")
    finally:
        job.kill()
    assert not job.active


@pytest.mark.timeout(120)
def test_a_module_on_two_hosts(quick_stop: Path) -> None:
    """``-m module`` with ``--nnodes=2``: two worker processes (hosts), one rank each, the
    module found from the working directory, its arguments passed through."""
    pkg = quick_stop / "trainpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helper.py").write_text("WHO = 'helper'\n")
    (pkg / "main.py").write_text(
        textwrap.dedent(
            """\
            import json, os, sys
            from trainpkg.helper import WHO
            keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "LOCAL_WORLD_SIZE")
            record = {k: os.environ[k] for k in keys}
            record.update(argv=sys.argv[1:], who=WHO, pid=os.getpid())
            with open(f"rank-{os.environ['RANK']}.json", "w") as f:
                json.dump(record, f)
            """
        )
    )
    job = serve("torchrun --nnodes=2 --nproc-per-node=1 -m trainpkg.main --flag x")
    try:
        assert isinstance(job.job, ProcessJob) and job.job._meshes == {"workers": 2}
        job.run_spmd(timeout=60)
        records = _ranks(quick_stop, 2)
        assert [r["GROUP_RANK"] for r in records] == ["0", "1"]
        assert {r["LOCAL_RANK"] for r in records} == {"0"}
        assert {r["WORLD_SIZE"] for r in records} == {"2"}
        assert all(r["argv"] == ["--flag", "x"] and r["who"] == "helper" for r in records)
    finally:
        job.kill()


@pytest.mark.timeout(120)
def test_a_rank_that_raises_fails_the_run_naming_it(quick_stop: Path) -> None:
    """SPMD-2: rank 1 raises before joining the group; rank 0 waits in
    ``init_process_group`` until run_spmd stops it; the error names rank 1 and what it
    raised, and the workers are still there for the next run."""
    pytest.importorskip("torch")
    out = quick_stop / "out"
    out.mkdir()
    command = ["torchrun", "--nproc-per-node=2", str(DDP_SCRIPT), "--out", str(out)]
    job = serve([*command, "--fail-rank", "1"])
    try:
        start = time.monotonic()
        with pytest.raises(SPMDRunError) as info:
            job.run_spmd(timeout=100)
        took = time.monotonic() - start
        message = str(info.value)
        assert info.value.ranks == [1]
        assert "failed on rank(s) 1 of 2:" in message
        assert "rank 1 (hosts=0, gpus=1): ValueError: rank 1 was told to fail" in message
        assert "the other ranks were stopped" in message
        assert 'spmd_ddp_script.py", line' in message  # the script's traceback
        assert not list(out.iterdir())  # rank 0 never finished
        assert took < 60, took  # not init_process_group's 120 s timeout
        print(f"run_spmd failed after {took:.1f} s")
        # SPMD-1: the same workers run the fixed command, in new procs.
        workers = [w.pid for w in job.job._workers.all()]  # type: ignore[attr-defined]
        fixed = SPMDJob(
            job.job,
            ["torchrun", "--nproc-per-node=2", str(DDP_SCRIPT), "--out", str(out), "--steps", "1"],
        )
        fixed.run_spmd(timeout=100)
        records = _ranks(out, 2)
        assert [r["same"] for r in records] == [True, True]
        assert [w.pid for w in job.job._workers.all()] == workers  # type: ignore[attr-defined]
        assert not {r["pid"] for r in records} & set(workers)  # procs, not the workers
    finally:
        job.kill()


@pytest.mark.timeout(120)
def test_an_exit_status_and_a_dead_proc_are_reported(quick_stop: Path) -> None:
    """A rank's ``sys.exit(3)`` and a rank whose proc dies (``os._exit``) fail the run,
    named with the status; the dead proc does not end this program (run_spmd handles
    its failure); ``sys.exit(0)`` is a success."""
    script = quick_stop / "exits.py"
    script.write_text(
        textwrap.dedent(
            """\
            import os, sys, time
            rank, how = int(os.environ["RANK"]), sys.argv[1]
            if rank == 1 and how == "exit":
                sys.exit(3)
            if rank == 1 and how == "die":
                os._exit(9)
            if how != "ok":
                time.sleep(60)
            sys.exit(0)
            """
        )
    )
    base = ["python", "-m", "torch.distributed.run", "--nproc-per-node=2", str(script)]
    job = serve([*base, "exit"])
    try:
        with pytest.raises(SPMDRunError) as info:
            job.run_spmd(timeout=100)
        assert info.value.ranks == [1], str(info.value)
        assert f"rank 1 (hosts=0, gpus=1): {script} exit exited with status 3" in str(info.value)

        with pytest.raises(SPMDRunError) as info:
            SPMDJob(job.job, [*base, "die"]).run_spmd(timeout=100)
        assert info.value.ranks == [1], str(info.value)
        message = str(info.value)
        assert "rank 1 (hosts=0, gpus=1): SupervisionError: " in message
        assert "exited with status 9" in message

        SPMDJob(job.job, [*base, "ok"]).run_spmd(timeout=60)
    finally:
        job.kill()


@pytest.mark.timeout(60)
def test_a_timeout_stops_the_ranks(quick_stop: Path) -> None:
    script = quick_stop / "sleeps.py"
    script.write_text("import time\ntime.sleep(60)\n")
    job = serve(["torchrun", "--nproc-per-node=2", str(script)])
    try:
        with pytest.raises(TimeoutError, match=r"did not finish within 2 s on rank\(s\) 0, 1 of 2"):
            job.run_spmd(timeout=2)
    finally:
        job.kill()


@pytest.mark.timeout(60)
def test_a_job_of_the_wrong_size_is_refused(quick_stop: Path) -> None:
    job = SPMDJob(ProcessJob({"trainers": 1}), ["torchrun", "--nnodes=2", "t.py"])
    try:
        with pytest.raises(ValueError, match=r"has 1 host\(s\).*asks for --nnodes=2"):
            job.run_spmd(timeout=30)
    finally:
        job.kill()
    with pytest.raises(TypeError, match="expected a job"):
        SPMDJob("local", ["torchrun", "t.py"])  # type: ignore[arg-type]


@pytest.mark.timeout(60)
def test_a_saved_job_reconnects_to_the_same_workers(quick_stop: Path) -> None:
    """What serve() does for Slurm and Kubernetes (the state cache), shown with a
    ProcessJob: a later SPMDJob of another script reuses the saved job's workers, and
    ``job_load`` gives back a job that runs."""
    script = quick_stop / "pid.py"
    script.write_text(
        "import os, sys\nopen(f'rank-{os.environ[\"RANK\"]}.json', 'w').write(str(os.getppid()))\n"
    )
    first = SPMDJob(ProcessJob({"workers": 1}), ["torchrun", str(script)])
    first.state()  # applies and saves at .monarch/job_state.pkl
    second = SPMDJob(ProcessJob({"workers": 1}), ["torchrun", str(script), "x"])
    try:
        workers = [w.pid for w in first.job._workers.all()]  # type: ignore[attr-defined]
        second.run_spmd(timeout=30)
        assert second.apply_id == first.apply_id  # reconnected, not applied
        loaded = monarch.job.spmd.job_load()
        assert isinstance(loaded, SPMDJob) and loaded.apply_id == first.apply_id
        loaded.run_spmd(timeout=30)
        assert [w.pid for w in loaded.job._workers.all()] == workers  # type: ignore[attr-defined]
        other = SPMDJob(ProcessJob({"workers": 1}), ["torchrun", str(script)], scheduler="slurm")
        assert not first.can_run(other)  # another scheduler
    finally:
        second.kill()
        first.kill()
    assert os.path.exists(quick_stop / ".monarch" / "job_state.pkl")
