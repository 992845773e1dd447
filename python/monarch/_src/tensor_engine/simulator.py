"""``monarch.Simulator``: a simulated mesh with no processes.

``Simulator(hosts, gpus)`` gives a mesh (``sim.mesh``, dimensions ``"host"`` and
``"gpu"``) that records torch programs exactly as a proc mesh does (``with
sim.mesh.activate():``, ``reduce``, streams, remote functions...), but sends the
commands to a cost model instead of tensor workers: each command gets a duration on an
assumed accelerator (:class:`~monarch._src.tensor_engine.sim_model.CostModel`), and
the commands of every rank and stream are placed in simulated time. The result is a
timeline (a Chrome trace, opened in Perfetto or ``chrome://tracing``: one process per
rank, one thread per stream) and a summary (``sim.display()``), to see how streams
overlap before renting GPUs.

The simulator models time, not values: no operator runs, and a fetch
(``monarch.inspect``, ``fetch_shard``) returns zeros of the tensor's shape and dtype.
Remote functions run once, in this process, only to learn the shapes of their results
(on fake tensors, or on zeros when that fails).

Commands recorded inside ``with monarch.set_meta("label"):`` carry the label in the
trace (after their name, and in their ``meta`` argument).

Guide: ``docs/simulator.md``.
"""

from __future__ import annotations

import enum
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from monarch._src.actor.future import Done, Future
from monarch._src.actor.proc_mesh import ProcMesh
from monarch._src.actor.shape import Shape
from monarch._src.actor.slice import Slice
from monarch._src.tensor_engine import wire
from monarch._src.tensor_engine.client.engine import FRAME_RING, Engine, View
from monarch._src.tensor_engine.sim_config import current_meta
from monarch._src.tensor_engine.sim_measure import (
    _dtype_name,
    _flops,
    _itemsize,
    _nbytes,
    _tensors_in,
)
from monarch._src.tensor_engine.sim_model import (
    GROUP,
    RUN,
    SIGNAL,
    WAIT,
    CostModel,
    Task,
    Timeline,
    format_us,
    numel,
)

if TYPE_CHECKING:
    from monarch._src.actor.actor import Actor
    from monarch._src.tensor_engine.client.stream import Stream

__all__ = [
    "CostModel",
    "SimulatedEngine",
    "SimulatedMesh",
    "Simulator",
    "SimulatorBackendMode",
    "SimulatorTraceMode",
]


class SimulatorBackendMode(enum.Enum):
    """What the simulator does with the recorded commands (``simulate_mode=``)."""

    #: Simulate, and write the trace at exit (the default).
    SIMULATE = enum.auto()
    #: Simulate; write no trace file (``display()`` and ``summary()`` still work).
    SIMULATE_WITH_REPORT_ONLY = enum.auto()
    #: Record the commands for a later replay: not supported.
    COMMAND_HISTORY = enum.auto()
    #: SIMULATE and COMMAND_HISTORY: not supported.
    EVERYTHING = enum.auto()


class SimulatorTraceMode(enum.Enum):
    """What the trace shows (``trace_mode=``)."""

    #: Only the controller (the client's batches of commands, in wall-clock time).
    CONTROLLER_TRACE_ONLY = enum.auto()
    #: Only the streams of every rank (the default).
    STREAM_ONLY = enum.auto()
    #: Both; a command then starts no earlier than the client sent it.
    EVERYTHING = enum.auto()


def _mode(value: Any, cls: type[enum.Enum], what: str) -> Any:
    if isinstance(value, cls):
        return value
    if isinstance(value, str) and value.upper() in cls.__members__:
        return cls[value.upper()]
    choices = [m.lower() for m in cls.__members__]
    raise ValueError(
        f"Simulator({what}={value!r}): expected one of {choices} (or a {cls.__name__})"
    )


def _count(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"Simulator({what}={value!r}): expected a positive int")
    if value < 1:
        raise ValueError(f"Simulator({what}={value}): expected a positive int (1 or more)")
    return value


class Simulator:
    """A simulated mesh of ``hosts`` x ``gpus`` ranks with no processes.

    ``sim.mesh`` is used like a proc mesh for tensors; the commands recorded on it are
    placed in simulated time by a cost model (``cost_model=``: a :class:`CostModel`
    or a dict of its settings; H100-class defaults). ``sim.display()`` prints a
    summary; ``sim.exit()`` (or ``sim.mesh.exit()``, or the end of a ``with`` block)
    writes the trace to ``trace_path`` (a Chrome trace JSON: open it in
    https://ui.perfetto.dev).

    ``simulate_mode``: ``"simulate"`` (default) or ``"simulate_with_report_only"``
    (no trace file); ``"command_history"``/``"everything"`` (record for replay) raise
    ``NotImplementedError``. ``trace_mode``: ``"stream_only"`` (default: one track per
    rank and stream), ``"controller_trace_only"`` (the client's batches) or
    ``"everything"`` (both). ``upload_trace=True`` and ``build_ir=True`` raise
    ``NotImplementedError``; ``command_history_path`` is accepted and unused;
    ``group_workers`` is accepted and ignored (every rank is simulated).
    """

    def __init__(
        self,
        hosts: int,
        gpus: int,
        *,
        simulate_mode: str | SimulatorBackendMode = SimulatorBackendMode.SIMULATE,
        trace_mode: str | SimulatorTraceMode = SimulatorTraceMode.STREAM_ONLY,
        upload_trace: bool = False,
        trace_path: str = "trace.json",
        command_history_path: str = "command_history.pkl",
        group_workers: bool = False,
        build_ir: bool = False,
        cost_model: CostModel | Mapping[str, Any] | None = None,
    ) -> None:
        self.hosts = _count(hosts, "hosts")
        self.gpus = _count(gpus, "gpus")
        self.simulate_mode: SimulatorBackendMode = _mode(
            simulate_mode, SimulatorBackendMode, "simulate_mode"
        )
        self.trace_mode: SimulatorTraceMode = _mode(trace_mode, SimulatorTraceMode, "trace_mode")
        if self.simulate_mode in (
            SimulatorBackendMode.COMMAND_HISTORY,
            SimulatorBackendMode.EVERYTHING,
        ):
            raise NotImplementedError(
                f"Simulator(simulate_mode={self.simulate_mode.name.lower()!r}): recording "
                "the commands for a later replay is not supported; use 'simulate' (writes "
                "the trace) or 'simulate_with_report_only'"
            )
        if upload_trace:
            raise NotImplementedError(
                "Simulator(upload_trace=True): uploading traces is not supported; open the "
                "file written to trace_path in https://ui.perfetto.dev instead"
            )
        if build_ir:
            raise NotImplementedError(
                "Simulator(build_ir=True): the simulator builds no IR graph; leave "
                "build_ir=False (the trace and summary() describe the program)"
            )
        if not isinstance(trace_path, (str, os.PathLike)):
            raise TypeError(f"Simulator(trace_path={trace_path!r}): expected a file path")
        self.trace_path = os.path.abspath(trace_path)
        folder = os.path.dirname(self.trace_path)
        if not os.path.isdir(folder):
            raise ValueError(
                f"Simulator(trace_path={str(trace_path)!r}): the folder {folder!r} does not "
                "exist; create it first or give another path"
            )
        self.command_history_path = command_history_path
        self.group_workers = group_workers
        self.cost_model = CostModel.of(cost_model)
        self.world_size = self.hosts * self.gpus
        self._timeline = Timeline(self.world_size)
        self._lock = threading.Lock()
        self._t0 = time.monotonic()
        self._last_send = 0.0
        self._exited = False
        self._fns: dict[int, Any] = {}
        self._ops: dict[int, tuple[str, Any, bool]] = {}
        self._names: dict[int, str] = {}
        self._views: dict[int, Shape] = {}
        #: ref -> tensor metadata (size, stride, offset, dtype, device).
        self.metas: dict[int, Any] = {}
        #: whole ref of a ``propagate="inspect"`` call -> (fid, args, kwargs).
        self._wholes: dict[int, tuple[int, Any, Any]] = {}
        self._signalled: set[tuple[int, int]] = set()
        _install_meta_hook()
        shape = Shape(["host", "gpu"], Slice.new_row_major([self.hosts, self.gpus]))
        self.mesh = SimulatedMesh(shape, self)
        self._engine = SimulatedEngine(self.mesh, self)
        self.mesh._tensor_engine.append(self._engine)

    # --- the public interface -----------------------------------------------------------

    def __enter__(self) -> Simulator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.exit()

    def __repr__(self) -> str:
        return f"Simulator(hosts={self.hosts}, gpus={self.gpus})"

    def exit(self) -> None:
        """Finish: send what is recorded, write the trace (unless
        ``simulate_mode="simulate_with_report_only"``) and take no more work. Calling
        it again does nothing."""
        if self._exited:
            return
        self._engine.close()
        self._exited = True
        self.mesh._stopped.append("the simulation ended (Simulator.exit)")
        if self.simulate_mode is SimulatorBackendMode.SIMULATE:
            self.write_trace()

    def write_trace(self, path: str | None = None) -> str:
        """Write the trace now to ``path`` (default ``trace_path``) and return that
        path."""
        self._settle()
        target = os.path.abspath(path) if path is not None else self.trace_path
        with self._lock:
            self._timeline.run()
            self._timeline.write(
                target,
                streams=self.trace_mode is not SimulatorTraceMode.CONTROLLER_TRACE_ONLY,
                controller=self.trace_mode is not SimulatorTraceMode.STREAM_ONLY,
            )
        return target

    def stats(self) -> dict[str, Any]:
        """The simulated time so far: ``elapsed_us`` (until the last command of any
        rank ends) and ``streams``, one dict per rank and stream with ``rank``,
        ``stream``, ``busy_us``, ``idle_us``, ``overlap_us`` (busy while another stream
        of the rank is busy) and ``commands``."""
        self._settle()
        with self._lock:
            self._timeline.run()
            return {
                "elapsed_us": self._timeline.elapsed_us(),
                "streams": self._timeline.stats(),
                "stuck": self._timeline.stuck(),
            }

    def summary(self) -> str:
        """:meth:`stats` as a table."""
        s = self.stats()
        total = s["elapsed_us"]
        lines = [
            f"simulated {self.world_size} ranks (host={self.hosts}, gpu={self.gpus}): "
            f"{format_us(total)}"
        ]
        header = ("rank", "stream", "commands", "busy", "idle", "overlap")
        rows = [
            (
                str(r["rank"]),
                r["stream"],
                str(r["commands"]),
                format_us(r["busy_us"]),
                format_us(r["idle_us"]),
                format_us(r["overlap_us"]),
            )
            for r in s["streams"]
        ]
        widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
        for row in (header, *rows):
            lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        for rank, stream, name in s["stuck"]:
            lines.append(
                f"rank {rank}, stream {stream!r}: stuck at {name} (what it waits for never "
                "happened)"
            )
        return "\n".join(lines)

    def display(self) -> None:
        """Print :meth:`summary` (and where the trace is written)."""
        text = self.summary()
        if self.simulate_mode is SimulatorBackendMode.SIMULATE:
            text += f"\ntrace: {self.trace_path} (written at exit; open in https://ui.perfetto.dev)"
        print(text)

    def upload(self) -> None:
        """Not supported: upstream Monarch's simulator can upload its trace; this one
        only writes it to ``trace_path``, to open in a Perfetto viewer.

        Raises:
            NotImplementedError: Always.
        """
        raise NotImplementedError(
            "Simulator.upload(): uploading traces is not supported; open the file written "
            "to trace_path in https://ui.perfetto.dev instead"
        )

    def export_ir(self, ir_path: str) -> None:
        """Not supported: upstream Monarch's simulator can export the IR graph of the
        recorded program; this one builds no such graph.

        Args:
            ir_path: Where the graph would be written.

        Raises:
            NotImplementedError: Always.
        """
        raise NotImplementedError(
            "Simulator.export_ir(): the simulator builds no IR graph (build_ir is not supported)"
        )

    # --- commands -----------------------------------------------------------------------

    def _settle(self) -> None:
        if not self._exited:
            self._engine.flush()

    def _now_us(self) -> float:
        return (time.monotonic() - self._t0) * 1e6

    def _batch(self, view: View, cmds: list[wire.Command]) -> None:
        """Place a batch of commands sent to ``view`` on its ranks' streams."""
        with self._lock:
            now = self._now_us()
            tl = self._timeline
            tl.controller.append(
                (f"{len(cmds)} commands to {dict(view.shape.extent)}", self._last_send, now)
            )
            self._last_send = now
            earliest = now if self.trace_mode is SimulatorTraceMode.EVERYTHING else 0.0
            ranks = view.shape.ranks()
            sid = 0
            for cmd in cmds:
                if isinstance(cmd, wire.SetStream):
                    sid = cmd.sid
                    if cmd.name or sid not in tl.stream_names:
                        tl.stream_names[sid] = cmd.name or f"stream {sid}"
                elif isinstance(cmd, wire.DefineFn):
                    self._fns[cmd.fid] = cmd.spec
                elif isinstance(cmd, wire.DefineView):
                    self._views[cmd.vid] = cmd.shape
                elif isinstance(cmd, wire.Delete):
                    for ref in cmd.refs:
                        self.metas.pop(ref, None)
                        self._wholes.pop(ref, None)
                elif isinstance(cmd, wire.Signal):
                    for r in ranks:
                        self._signalled.add((cmd.token, r))
                        tl.add(r, sid, Task(SIGNAL, "signal", 0.0, key=(cmd.token, r)))
                elif isinstance(cmd, wire.Wait):
                    for r in ranks:
                        if (cmd.token, r) in self._signalled:
                            self._signalled.discard((cmd.token, r))
                            tl.add(r, sid, Task(WAIT, "wait", 0.0, key=(cmd.token, r)))
                elif isinstance(cmd, wire.Reduce):
                    self._reduce(cmd, view, sid, earliest)
                elif isinstance(cmd, wire.Send):
                    self._p2p_send(cmd, sid, earliest)
                elif isinstance(cmd, wire.Recv):
                    self._p2p_recv(cmd, view, sid, earliest)
                else:
                    work = self._work(cmd)
                    if work is None:
                        continue
                    name, dur, cat, args = work
                    name = self._labelled(wire.seq_of(cmd), name)
                    for r in ranks:
                        tl.add(r, sid, Task(RUN, name, dur, cat, args=args, earliest=earliest))

    def _frame(self, seq: int, args: dict[str, Any]) -> dict[str, Any]:
        args["seq"] = seq
        frames = self._engine.frames_of(seq)
        if frames:
            file, line, fn = frames[-1]
            args["at"] = f"{file}:{line} ({fn})"
        labels = self._engine.labels_of(seq)
        if labels:
            args["meta"] = list(labels)
        return args

    def _labelled(self, seq: int, name: str) -> str:
        """``name`` followed by the ``monarch.set_meta`` labels command ``seq`` was
        recorded under."""
        labels = self._engine.labels_of(seq)
        return " ".join((name, *labels)) if labels else name

    def _work(self, cmd: wire.Command) -> tuple[str, float, str, dict[str, Any]] | None:
        """The name, duration, category and trace arguments of an ordinary command
        (``None``: it takes no time and is not shown)."""
        cost = self.cost_model
        if isinstance(cmd, wire.Op):
            seq, fid, args, kwargs, outs = cmd.seq, cmd.fid, cmd.args, cmd.kwargs, cmd.outs
            name, fn, is_view = self._op(fid)
            if is_view:
                return None
            inputs = _tensors_in((args, kwargs), self.metas)
            outputs = [self.metas[o] for o in outs if o in self.metas]
            nbytes = 0
            if not name.split(".")[1 if "." in name else 0].startswith("empty"):
                nbytes = sum(_nbytes(m) for m in inputs) + sum(_nbytes(m) for m in outputs)
            flops = _flops(fn, args, kwargs, outputs, self.metas)
            first = (inputs or outputs or [None])[0]
            dtype = _dtype_name(first[3]) if first is not None else "default"
            info: dict[str, Any] = {"bytes": nbytes}
            if flops:
                info["flops"] = flops
            return (name, cost.compute_us(flops, nbytes, dtype), "compute", self._frame(seq, info))
        if isinstance(cmd, wire.Call):
            seq, fid, args, kwargs, outs, whole = (
                cmd.seq,
                cmd.fid,
                cmd.args,
                cmd.kwargs,
                cmd.outs,
                cmd.whole,
            )
            if whole is not None:
                self._wholes[whole] = (fid, args, kwargs)
            inputs = _tensors_in((args, kwargs), self.metas)
            outputs = [self.metas[o] for o in outs if o in self.metas]
            nbytes = sum(_nbytes(m) for m in inputs) + sum(_nbytes(m) for m in outputs)
            fname = self._names.get(fid)
            if fname is None:
                fname = self._names[fid] = _fn_name(self._fns.get(fid))
            return (
                fname,
                cost.compute_us(0, nbytes, "default"),
                "remote",
                self._frame(seq, {"bytes": nbytes}),
            )
        if isinstance(cmd, wire.Rank):
            return ("rank", cost.kernel_overhead_us, "compute", self._frame(cmd.seq, {}))
        # Peers, Unpack, Alias, Fail, ActorWork: no device time.
        return None

    def _op(self, fid: int) -> tuple[str, Any, bool]:
        entry = self._ops.get(fid)
        if entry is None:
            import torch

            spec = self._fns.get(fid)
            fn: Any = None
            if spec is not None and spec[0] == "op":
                _, namespace, opname, overload = spec
                try:
                    fn = getattr(getattr(getattr(torch.ops, namespace), opname), overload)
                except AttributeError:
                    fn = None
                name = f"{namespace}.{opname}" + ("" if overload == "default" else f".{overload}")
            else:
                name = _fn_name(spec)
            is_view = bool(getattr(fn, "is_view", False))
            entry = self._ops[fid] = (name, fn, is_view)
        return entry

    def _groups(self, view: View, vid: int, dims: Sequence[str]) -> dict[int, tuple[int, ...]]:
        shape = self._views.get(vid) or view.shape
        out = {}
        for r in view.shape.ranks():
            point = shape.coordinates(r)
            sub = shape
            for label in shape.labels:
                if label not in dims:
                    sub = sub.select(label, point[label])
            out[r] = tuple(sub.ranks())
        return out

    def _inter_host(self, ranks: Sequence[int]) -> bool:
        return len({r // self.gpus for r in ranks}) > 1

    def _reduce(self, cmd: wire.Reduce, view: View, sid: int, earliest: float) -> None:
        seq, vid, dims, reduction, scatter = cmd.seq, cmd.vid, cmd.dims, cmd.reduction, cmd.scatter
        size, dtype, _device = cmd.meta
        if reduction == "stack":
            kind = "all_to_all" if scatter else "all_gather"
        else:
            kind = "reduce_scatter" if scatter else "all_reduce"
        nbytes = numel(size) * _itemsize(dtype)
        name = self._labelled(seq, kind if reduction == "stack" else f"{kind}({reduction})")
        cache: dict[tuple[int, ...], tuple[float, dict[str, Any]]] = {}
        for r, members in self._groups(view, vid, dims).items():
            got = cache.get(members)
            if got is None:
                dur = self.cost_model.collective_us(
                    kind, nbytes, len(members), self._inter_host(members)
                )
                info = self._frame(seq, {"bytes": nbytes, "ranks": list(members)})
                got = cache[members] = (dur, info)
            dur, info = got
            task = Task(
                GROUP,
                name,
                dur,
                "collective",
                key=("reduce", seq, members),
                n=len(members),
                args=info,
                earliest=earliest,
            )
            self._timeline.add(r, sid, task)

    def _p2p_send(self, cmd: wire.Send, sid: int, earliest: float) -> None:
        seq, ref, routes = cmd.seq, cmd.ref, cmd.routes
        meta = self.metas.get(ref)
        nbytes = _nbytes(meta) if meta is not None else 0
        for src, dsts in routes.items():
            for dst in dsts:
                if dst == src:
                    continue
                dur = self.cost_model.collective_us("send", nbytes, 2, self._inter_host((src, dst)))
                info = self._frame(seq, {"bytes": nbytes, "to": dst})
                name = self._labelled(seq, "send")
                task = Task(GROUP, name, dur, "p2p", key=("p2p", seq, src, dst), n=2, args=info)
                task.earliest = earliest
                self._timeline.add(src, sid, task)

    def _p2p_recv(self, cmd: wire.Recv, view: View, sid: int, earliest: float) -> None:
        seq, out, sources = cmd.seq, cmd.out, cmd.sources
        meta = self.metas.get(out)
        nbytes = _nbytes(meta) if meta is not None else 0
        for dst in view.shape.ranks():
            src = sources.get(dst)
            if src is None:
                continue
            if src == dst:
                dur = self.cost_model.compute_us(0, 2 * nbytes, "default")
                info = self._frame(seq, {"bytes": nbytes})
                name = self._labelled(seq, "copy")
                self._timeline.add(dst, sid, Task(RUN, name, dur, args=info, earliest=earliest))
                continue
            dur = self.cost_model.collective_us("send", nbytes, 2, self._inter_host((src, dst)))
            info = self._frame(seq, {"bytes": nbytes, "from": src})
            name = self._labelled(seq, "recv")
            task = Task(GROUP, name, dur, "p2p", key=("p2p", seq, src, dst), n=2, args=info)
            task.earliest = earliest
            self._timeline.add(dst, sid, task)

    # --- what workers would answer ------------------------------------------------------

    def _zeros(self, ref: int) -> Any:
        import torch

        from monarch._src.tensor_engine.client import _torch

        meta = self.metas.get(ref)
        if meta is None:
            raise RuntimeError(
                f"the simulator knows no tensor with ref {ref}: it was freed, or made "
                "outside the simulated mesh"
            )
        with _torch.disable_modes():
            return torch.zeros(tuple(meta[0]), dtype=meta[3])

    def _placeholders(self, value: Any) -> Any:
        """``value`` with every ref replaced by zeros of its tensor's metadata."""
        from torch.utils._pytree import tree_map

        def make(x: Any) -> Any:
            if isinstance(x, wire.Ref):
                return self._zeros(x.id)
            if isinstance(x, wire.GroupRef):
                raise NotImplementedError(
                    "the simulator cannot run a remote function that takes a process group "
                    "(monarch.RemoteProcessGroup): there are no processes to form one"
                )
            return x

        return tree_map(make, value)

    def _run_remote(self, spec: tuple[Any, ...], args: Any, kwargs: Any, *_sids: Any) -> Any:
        from monarch._src.tensor_engine.client import _torch

        fn = _resolve_fn(spec)
        args, kwargs = self._placeholders((list(args), dict(kwargs)))
        with _torch.disable_modes():
            return fn(*args, **kwargs)

    def _propagate(self, spec: tuple[Any, ...], args: Any, kwargs: Any, *_sids: Any) -> Any:
        """What a remote function's result looks like, from a run on fake tensors of
        the inputs' metadata (or, when that fails, on zeros)."""
        import torch
        from torch.utils._pytree import tree_map

        from monarch._src.tensor_engine.client import _torch

        fn = _resolve_fn(spec)

        def to_meta(x: Any) -> Any:
            if isinstance(x, torch.Tensor):
                return wire.TensorMeta(tuple(x.shape), tuple(x.stride()), x.dtype, str(x.device))
            return x

        def fake(x: Any) -> Any:
            if isinstance(x, wire.TensorMeta):
                size = tuple(x.size)
                return _torch.fake_of((size, tuple(x.stride), 0, x.dtype, torch.device(x.device)))
            return x

        with _torch.disable_modes():
            try:
                with _torch.fake_mode():
                    fargs, fkwargs = tree_map(fake, (list(args), dict(kwargs)))
                    out = fn(*fargs, **fkwargs)
                return tree_map(to_meta, out)
            except Exception:
                pass

            def zeros(x: Any) -> Any:
                if isinstance(x, wire.TensorMeta):
                    return torch.zeros(tuple(x.size), dtype=x.dtype)
                return x

            zargs, zkwargs = tree_map(zeros, (list(args), dict(kwargs)))
            return tree_map(to_meta, fn(*zargs, **zkwargs))

    def _describe(self, whole: int, *_sids: Any) -> Any:
        entry = self._wholes.get(whole)
        if entry is None:
            raise RuntimeError(f"the simulator has no result under ref {whole}")
        fid, args, kwargs = entry
        spec = self._fns[fid]
        metas = self._placeholders_meta((args, kwargs))
        return self._propagate(spec, *metas)

    def _placeholders_meta(self, value: Any) -> Any:
        from torch.utils._pytree import tree_map

        def make(x: Any) -> Any:
            if isinstance(x, wire.Ref):
                m = self.metas[x.id]
                return wire.TensorMeta(m[0], m[1], m[3], str(m[4]))
            return x

        args, kwargs = value
        return tree_map(make, (list(args), dict(kwargs)))


# --- the mesh and the engine ---------------------------------------------------------------


class SimulatedMesh(ProcMesh):
    """The mesh of a :class:`Simulator`: a proc mesh with no processes. Tensors work
    on it as on a proc mesh; actors cannot be spawned on it. ``exit()`` ends the
    simulation (and writes the trace)."""

    def __init__(self, shape: Shape, sim: Simulator) -> None:
        super().__init__(None, shape)  # type: ignore[arg-type]
        self._sim = sim

    def _new_with_shape(self, shape: Shape) -> SimulatedMesh:
        view = SimulatedMesh(shape, self._sim)
        view._stopped = self._stopped
        view._root = self._root
        view._tensor_engine = self._tensor_engine
        return view

    def _describe(self) -> str:
        return f"simulated mesh with extent {self.sizes}"

    @property
    def simulator(self) -> Simulator:
        return self._sim

    def spawn(self, name: str, Class: type[Actor], *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"spawn({name!r}): a simulated mesh has no processes, so actors cannot run on "
            "it; the simulator runs tensor programs only (spawn actors on real procs: "
            "this_host().spawn_procs(...))"
        )

    @property
    def initialized(self) -> Future[bool]:
        return Future(impl=Done(True))

    @property
    def host_mesh(self) -> Any:
        raise NotImplementedError("a simulated mesh has no host mesh")

    def stop(self, reason: str = "stopped by client") -> Future[None]:
        """End the simulation (as :meth:`Simulator.exit`)."""
        self._sim.exit()
        return Future(impl=Done(None))

    def exit(self) -> None:
        """End the simulation and write the trace (:meth:`Simulator.exit`)."""
        self._sim.exit()

    async def logging_option(self, *args: Any, **kwargs: Any) -> None:
        return None

    def __reduce__(self) -> tuple[Any, ...]:
        raise TypeError("a simulated mesh cannot be pickled: it exists only in this process")

    def __repr__(self) -> str:
        return f"SimulatedMesh({self.sizes})"


class SimulatedEngine(Engine):
    """The tensor engine of a simulated mesh: no controller and no workers; each
    batch of commands goes to the simulator instead of the network, and what workers
    would answer (fetches, remote functions' shapes) is answered here."""

    def __init__(self, root: ProcMesh, sim: Simulator) -> None:
        self.sim = sim
        #: seq % FRAME_RING -> (seq, the ``monarch.set_meta`` labels it was recorded under).
        self.labels: dict[int, tuple[int, tuple[str, ...]]] = {}
        super().__init__(root)

    tracks_meta = True

    def issue(
        self,
        view: View,
        cmd: wire.Command,
        fid: int = 0,
        frame: Any = None,
        stream: Stream | None = None,
    ) -> None:
        """As ``Engine.issue``; also keeps the ``monarch.set_meta`` labels the command is
        recorded under, for the trace."""
        labels = current_meta()
        if labels:
            seq = wire.seq_of(cmd)
            if seq >= 0:
                self.labels[seq % FRAME_RING] = (seq, labels)
        super().issue(view, cmd, fid, frame, stream)

    def labels_of(self, seq: int) -> tuple[str, ...]:
        """The ``monarch.set_meta`` labels command ``seq`` was recorded under."""
        entry = self.labels.get(seq % FRAME_RING)
        return entry[1] if entry is not None and entry[0] == seq else ()

    def tensor_made(self, ref: int, meta: Any) -> None:
        self.sim.metas[ref] = meta

    def _start(self) -> None:
        self.controller = None  # type: ignore[assignment]
        self.workers = _Workers(self.sim, self.root._shape)

    def _send(self, view: View, cmds: list[wire.Command]) -> bool:
        if self.failure is not None or self.closed:
            return False
        try:
            self.sim._batch(view, cmds)
        except Exception as e:
            self.fail(
                RuntimeError(
                    f"the simulator could not simulate a batch of commands: {type(e).__name__}: {e}"
                )
            )
            return False
        return True

    def check(self) -> None:
        if self.closed and self.failure is None:
            raise RuntimeError(
                f"the simulation of {self.root!r} has ended (Simulator.exit() was called, and "
                "the trace written); make a new monarch.Simulator to simulate more"
            )
        super().check()

    def ensure_peers(self) -> None:
        self.ports = []

    def fetch(self, view: View, rank: int, refs: list[int], sids: list[int]) -> Future[Any]:
        """Zeros of each tensor's shape and dtype (the simulator models time, not
        values)."""
        sim = self.sim
        return _answer(lambda: [sim._zeros(r) for r in refs], ())


class _Workers:
    """What stands for the workers of part of a simulated mesh: their endpoints
    answer at once, in this process."""

    def __init__(self, sim: Simulator, shape: Shape) -> None:
        self._sim = sim
        self._shape = shape

    def _new_with_shape(self, shape: Shape) -> _Workers:
        return _Workers(self._sim, shape)

    @property
    def fetch(self) -> _Endpoint:
        sim = self._sim
        return _Endpoint(self._shape, lambda refs, *_: [sim._zeros(r) for r in refs])

    @property
    def call_function(self) -> _Endpoint:
        return _Endpoint(self._shape, self._sim._run_remote)

    @property
    def propagate(self) -> _Endpoint:
        return _Endpoint(self._shape, self._sim._propagate)

    @property
    def describe(self) -> _Endpoint:
        return _Endpoint(self._shape, self._sim._describe)

    def __getattr__(self, name: str) -> Any:
        raise NotImplementedError(
            f"the simulator has no tensor worker endpoint {name!r}: this operation needs "
            "real processes"
        )


class _Raised:
    def __init__(self, error: BaseException) -> None:
        self.error = error

    def wait(self, timeout: float | None) -> Any:
        raise self.error

    async def wait_async(self) -> Any:
        raise self.error


def _answer(fn: Callable[..., Any], args: tuple[Any, ...]) -> Future[Any]:
    try:
        return Future(impl=Done(fn(*args)))
    except Exception as e:
        return Future(impl=_Raised(e))


class _Endpoint:
    """An endpoint of simulated workers: every rank would answer the same, so the
    function runs once."""

    def __init__(self, shape: Shape, fn: Callable[..., Any]) -> None:
        self._shape = shape
        self._fn = fn

    def call_one(self, *args: Any) -> Future[Any]:
        return _answer(self._fn, args)

    def choose(self, *args: Any) -> Future[Any]:
        return _answer(self._fn, args)

    def call(self, *args: Any) -> Future[Any]:
        from monarch._src.actor.value_mesh import ValueMesh

        shape = self._shape
        return _answer(lambda *a: ValueMesh(shape, [self._fn(*a)] * len(shape.ranks())), args)

    def broadcast(self, *args: Any) -> None:
        self._fn(*args)

    def stream(self, *args: Any) -> Iterator[Future[Any]]:
        for _ in self._shape.ranks():
            yield _answer(self._fn, args)


# --- helpers -------------------------------------------------------------------------------


def _resolve_fn(spec: tuple[Any, ...]) -> Any:
    import importlib

    from monarch._src.actor.pickling import loads

    kind = spec[0]
    if kind == "path":
        if len(spec) > 2:
            module, qualname = spec[1], spec[2]
        else:
            module, _, qualname = spec[1].rpartition(".")
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        return obj
    if kind == "pickle":
        return loads(spec[1])
    raise ValueError(f"the simulator cannot run the function {spec!r}")


def _fn_name(spec: Any) -> str:
    if spec is None:
        return "remote function"
    if spec[0] == "op":
        return f"{spec[1]}.{spec[2]}"
    if spec[0] == "path":
        return str(spec[2] if len(spec) > 2 else spec[1].rpartition(".")[2])
    try:
        return str(getattr(_resolve_fn(spec), "__qualname__", "remote function"))
    except Exception:
        return "remote function"


_hook_lock = threading.Lock()
_hook_installed = False


def _install_meta_hook() -> None:
    """Let CUDA tensors be recorded on a simulated mesh without CUDA (installed on the
    first ``Simulator``)."""
    global _hook_installed
    with _hook_lock:
        if _hook_installed:
            return
        _skip_cuda_init_when_simulating()
        _hook_installed = True


def _skip_cuda_init_when_simulating() -> None:
    """Let a program on a simulated mesh make CUDA tensors on a host without CUDA:
    torch initializes CUDA before a CUDA factory (``torch.randn(..., device="cuda")``)
    reaches the recording; while a simulated mesh is the active mesh and CUDA is not
    available, that initialization is skipped (nothing runs on a device anyway)."""
    import torch

    from monarch._src.tensor_engine.client.tensor import current_view

    original: Any = torch.cuda._lazy_init

    def _lazy_init() -> None:
        view = current_view()
        if (
            view is not None
            and type(view.engine) is SimulatedEngine
            and not torch.cuda.is_available()
        ):
            return
        original()

    torch.cuda._lazy_init = _lazy_init
