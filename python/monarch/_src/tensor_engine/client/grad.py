"""Incremental backward passes: ``grad_generator`` and ``grad_function``.

:func:`grad_generator` walks torch's autograd graph in the client, one node at a time,
and yields the gradient of the roots with respect to each requested tensor as soon as
it is complete, running only the part of the backward pass that this gradient needs.
Between two gradients the caller may record other work, for example a reduction of the
gradient just produced on a communication stream, so that it overlaps the rest of the
backward pass on the workers. It works on monarch tensors (each backward operation is
recorded like any operation) and on local torch tensors alike.

:func:`grad_function` turns a function that returns ``(result, backward)`` into an
autograd function whose backward pass is ``backward``.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import types
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.autograd.graph import GradientEdge, get_gradient_edge

from monarch._src.tensor_engine.client.stream import get_active_stream
from monarch._src.tensor_engine.client.tensor import Tensor

__all__ = ["GradientGenerator", "grad_function", "grad_generator"]

#: What may name a root or a tensor to differentiate against.
TensorOrEdge = torch.Tensor | GradientEdge | tuple[Any, int]


def _edge(x: Any, what: str, i: int) -> tuple[Any, int]:
    """``(node, input_nr)`` of a tensor (its gradient edge) or of an edge given as such."""
    if isinstance(x, torch.Tensor):
        if not x.requires_grad:
            raise ValueError(
                f"{what}[{i}] does not require grad, so it has no gradient: expected a "
                "tensor computed from tensors with requires_grad=True (or one itself); "
                "set requires_grad=True on the parameters before the forward pass"
            )
        e = get_gradient_edge(x)
        return e.node, e.output_nr
    if isinstance(x, GradientEdge):
        return x.node, x.output_nr
    if isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], int):
        return x[0], x[1]
    raise TypeError(
        f"{what}[{i}] is a {type(x).__name__}: expected a tensor, a "
        "torch.autograd.graph.GradientEdge or a (node, input_nr) pair"
    )


def _is_python_node(node: Any) -> bool:
    """Whether ``node`` is the backward of a Python ``torch.autograd.Function``."""
    return isinstance(node, torch.autograd.function.BackwardCFunction)


def _sequence_nr(node: Any) -> int:
    try:
        return int(node._sequence_nr())
    except (AttributeError, RuntimeError):
        return -1


def _conform(grad: torch.Tensor, metadata: Any) -> torch.Tensor:
    """What the autograd engine does to a gradient before it enters a node's input:
    sum over broadcast dimensions and cast to the input's dtype."""
    shape = tuple(metadata.shape)
    if tuple(grad.shape) != shape:
        try:
            torch.broadcast_shapes(shape, tuple(grad.shape))  # type: ignore[no-untyped-call]
        except RuntimeError:
            raise RuntimeError(
                f"backward produced a gradient of shape {tuple(grad.shape)} for an input "
                f"of shape {shape}: the shapes do not broadcast (a custom backward "
                "returned a gradient of the wrong shape?)"
            ) from None
        grad = grad.sum_to_size(shape)
    if grad.dtype != metadata.dtype:
        grad = grad.to(metadata.dtype)
    return grad


def _on_stream_of(grads: list[torch.Tensor | None]) -> Any:
    """Activates the stream of the first monarch tensor of ``grads`` (the stream the
    backward pass runs on), so that a node runs there whatever stream the caller left
    active between two gradients."""
    for g in grads:
        if isinstance(g, Tensor):
            if g.stream is not get_active_stream():
                return g.stream.activate()
            break
    return contextlib.nullcontext()


class _Node:
    """The walk's state of one autograd node reachable from the roots."""

    __slots__ = ("buffer", "done", "needed", "node", "pending", "pending_in", "seq", "users")

    def __init__(self, node: Any) -> None:
        self.node = node
        n_in = len(node._input_metadata)
        #: the gradients of the node's outputs in the forward pass, summed so far
        self.buffer: list[torch.Tensor | None] = [None] * n_in
        #: per input: the edges into it that have not delivered yet
        self.pending_in = [0] * n_in
        self.pending = 0
        #: per input: the nodes with an edge into it (their walk states)
        self.users: list[list[_Node]] = [[] for _ in range(n_in)]
        self.needed = False
        self.done = False
        self.seq = _sequence_nr(node)


class GradientGenerator:
    """The iterator :func:`grad_generator` returns: ``next()`` runs the backward pass
    up to the next requested gradient and returns it (``None`` for a tensor the roots do
    not depend on)."""

    def __init__(
        self,
        roots: Sequence[TensorOrEdge],
        with_respect_to: Sequence[TensorOrEdge],
        grad_roots: Sequence[torch.Tensor | None] = (),
    ) -> None:
        if len(grad_roots) > len(roots):
            raise ValueError(
                f"{len(grad_roots)} grad_roots for {len(roots)} roots: expected at most "
                "one incoming gradient per root (None for ones)"
            )
        root_edges = [_edge(r, "roots", i) for i, r in enumerate(roots)]
        self._wrt = [_edge(w, "with_respect_to", i) for i, w in enumerate(with_respect_to)]
        self._states: dict[Any, _Node] = {}
        self._ready: list[tuple[int, int, _Node]] = []
        self._tick = 0
        #: edges requested, for keeping their gradient when their node runs
        self._requested: set[tuple[int, int]] = {(id(n), nr) for n, nr in self._wrt}
        self._kept: dict[tuple[int, int], torch.Tensor | None] = {}
        self._next = 0
        #: number of node calls so far (for tests and curiosity)
        self.nodes_run = 0
        self._build([n for n, _ in root_edges])
        for i, (node, nr) in enumerate(root_edges):
            g = grad_roots[i] if i < len(grad_roots) else None
            if g is None:
                g = self._ones(roots[i], node, nr)
            self._add(self._states[node], nr, g)

    def _build(self, root_nodes: list[Any]) -> None:
        todo: list[_Node] = []
        for node in root_nodes:
            if node not in self._states:
                self._states[node] = s = _Node(node)
                todo.append(s)
        while todo:
            s = todo.pop()
            for nxt, nr in s.node.next_functions:
                if nxt is None:
                    continue
                t = self._states.get(nxt)
                if t is None:
                    self._states[nxt] = t = _Node(nxt)
                    todo.append(t)
                t.users[nr].append(s)
                t.pending_in[nr] += 1
                t.pending += 1

    @staticmethod
    def _ones(root: Any, node: Any, nr: int) -> torch.Tensor:
        if isinstance(root, torch.Tensor):
            return torch.ones_like(root, memory_format=torch.contiguous_format)
        md = node._input_metadata[nr]
        return torch.ones(tuple(md.shape), dtype=md.dtype, device=md.device)

    def _add(self, s: _Node, nr: int, g: torch.Tensor) -> None:
        g = _conform(g, s.node._input_metadata[nr])
        old = s.buffer[nr]
        s.buffer[nr] = g if old is None else old + g

    def _push(self, s: _Node) -> None:
        # Later forward operations first, as torch's engine does; ties in arrival order.
        self._tick += 1
        heapq.heappush(self._ready, (-s.seq, self._tick, s))

    def _need(self, s: _Node, nr: int) -> None:
        """Marks every node the gradient at ``s``'s input ``nr`` waits for."""
        scan = list(s.users[nr])
        while scan:
            u = scan.pop()
            if u.needed:
                continue
            u.needed = True
            if u.pending == 0:
                self._push(u)
            for users in u.users:
                scan.extend(users)

    def _run(self, s: _Node) -> None:
        node = s.node
        inputs, s.buffer = s.buffer, [None] * len(s.buffer)
        s.done = True
        for nr, g in enumerate(inputs):
            if (id(node), nr) in self._requested:
                self._kept[(id(node), nr)] = g
        edges = node.next_functions
        self.nodes_run += 1
        outputs: Sequence[torch.Tensor | None]
        with torch.no_grad(), _on_stream_of(inputs):
            if _is_python_node(node):
                outputs = self._run_python(node, inputs, edges)
            else:
                out = node(*inputs)
                outputs = out if isinstance(out, tuple) else (out,)
            del inputs
            for (nxt, nr), g in zip(edges, outputs, strict=False):
                if nxt is None:
                    continue
                t = self._states[nxt]
                if g is not None:
                    self._add(t, nr, g)
                t.pending_in[nr] -= 1
                t.pending -= 1
                if t.pending == 0 and t.needed:
                    self._push(t)

    @staticmethod
    def _run_python(
        node: Any, inputs: list[torch.Tensor | None], edges: Sequence[tuple[Any, int]]
    ) -> list[torch.Tensor | None]:
        # The backward of a Python autograd.Function maps its gradients to the forward's
        # arguments, not to its edges: run it through the engine, stopping at its edges.
        outs: list[GradientEdge] = []
        grads: list[torch.Tensor] = []
        for nr, g in enumerate(inputs):
            if g is None:
                md = node._input_metadata[nr]
                g = torch.zeros(tuple(md.shape), dtype=md.dtype, device=md.device)
            outs.append(GradientEdge(node, nr))
            grads.append(g)
        targets: list[GradientEdge] = []
        index: dict[tuple[int, int], int] = {}
        for nxt, nr in edges:
            if nxt is not None and (id(nxt), nr) not in index:
                index[(id(nxt), nr)] = len(targets)
                targets.append(GradientEdge(nxt, nr))
        if not targets:
            return [None] * len(edges)
        res = torch.autograd.grad(outs, targets, grads, allow_unused=True)
        result: list[torch.Tensor | None] = []
        seen: set[tuple[int, int]] = set()
        for nxt, nr in edges:
            key = (id(nxt), nr)
            # an edge met twice got the sum of both once: deliver it on the first
            result.append(None if nxt is None or key in seen else res[index[key]])
            seen.add(key)
        return result

    def __iter__(self) -> GradientGenerator:
        return self

    def __next__(self) -> torch.Tensor | None:
        if self._next >= len(self._wrt):
            raise StopIteration
        node, nr = self._wrt[self._next]
        self._next += 1
        s = self._states.get(node)
        if s is None:
            return None  # the roots do not depend on it
        if s.done:
            return self._kept.get((id(node), nr))
        self._need(s, nr)
        while s.pending_in[nr] > 0:
            if not self._ready:
                raise RuntimeError(
                    "grad_generator found no node to run while a gradient was still "
                    "incomplete: the autograd graph changed during the walk (was it "
                    "used by another backward pass meanwhile?)"
                )
            _, _, u = heapq.heappop(self._ready)
            self._run(u)
        return s.buffer[nr]


def grad_generator(
    roots: torch.Tensor | Sequence[TensorOrEdge] = (),
    with_respect_to: Sequence[TensorOrEdge] = (),
    grad_roots: Sequence[torch.Tensor | None] = (),
) -> GradientGenerator:
    """Yields the gradients of ``roots`` with respect to each tensor of
    ``with_respect_to``, one at a time, in that order.

    ``roots`` is a tensor or a sequence of them (or gradient edges); ``grad_roots`` the
    gradients flowing into them (missing or ``None``: ones of the root's shape, as for a
    scalar loss). Each ``next()`` runs only the part of the backward pass that the next
    gradient still needs, so work recorded between two gradients (a reduction of the
    last one, on another stream) overlaps the rest of the backward pass on the workers.
    Gradients are those ``torch.autograd.grad`` would give; a tensor that the roots do
    not depend on yields ``None``. ``.grad`` attributes are not touched.

    Ask for the parameters in the reverse order of their use in the forward pass (last
    layer first) to get each gradient after the least work.

    Works on monarch tensors (the backward operations are recorded like any other, on
    the stream of the gradients they read, whatever stream is active when ``next()``
    is called) and on local torch tensors.
    """
    if isinstance(roots, torch.Tensor):
        roots = [roots]
    return GradientGenerator(list(roots), list(with_respect_to), list(grad_roots))


_EMPTY = object()


def _contents(cell: types.CellType) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # a variable not assigned yet
        return _EMPTY


class _GradFunction(torch.autograd.Function):
    """Runs ``fn``; its backward is the continuation ``fn`` returned."""

    @staticmethod
    def forward(ctx: Any, fn: Callable[..., Any], *args: Any) -> Any:
        result, backward = fn(*args)
        if not isinstance(backward, types.FunctionType):
            raise TypeError(
                f"the function given to grad_function returned {type(backward).__name__} "
                "as its backward: expected `return result, backward` with backward a "
                "Python function (e.g. a nested def) taking the gradients of result"
            )
        # The tensors the continuation closes over directly are saved the autograd way
        # (so that an in-place change of one is caught, and so that saved-tensor hooks
        # apply); the other values of its closure are kept as they are. The cells
        # themselves are left alone: they may be shared with the caller's scope.
        values = [_contents(c) for c in backward.__closure__ or ()]
        slots = [i for i, v in enumerate(values) if isinstance(v, torch.Tensor)]
        ctx.save_for_backward(*(values[i] for i in slots))
        for i in slots:
            values[i] = None
        ctx.values, ctx.slots, ctx.n_args = values, slots, len(args)
        ctx.code = (
            backward.__code__,
            backward.__globals__,
            backward.__name__,
            backward.__defaults__,
            backward.__kwdefaults__,
        )
        return result

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        values = list(ctx.values)
        for i, t in zip(ctx.slots, ctx.saved_tensors, strict=True):
            values[i] = t
        code, globs, name, defaults, kwdefaults = ctx.code
        fn = types.FunctionType(
            code,
            globs,
            name,
            defaults,
            tuple(types.CellType() if v is _EMPTY else types.CellType(v) for v in values),
        )
        fn.__kwdefaults__ = kwdefaults
        out = fn(*grads)
        got = out if isinstance(out, tuple) else (out,)
        if len(got) > ctx.n_args:
            raise TypeError(
                f"the backward of {name} returned {len(got)} gradients for "
                f"{ctx.n_args} positional arguments: expected at most one per argument"
            )
        # arguments left out at the end (constants, say) get no gradient
        return (None, *got, *([None] * (ctx.n_args - len(got))))


def grad_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A differentiable function from ``fn(*args) -> (result, backward)``.

    ``fn`` computes ``result`` (not recorded by autograd) and returns it with
    ``backward``, a function (usually a closure defined inside ``fn``) that takes the
    gradients of ``result`` and returns the gradient of each positional argument (a
    tuple when there are several; ``None``, or nothing for the last ones, for an
    argument that needs none). Keyword arguments are passed to ``fn`` and get no
    gradient. The tensors ``backward`` closes over directly are kept the way
    ``ctx.save_for_backward`` keeps them (changing one in place before the backward
    pass is an error)::

        @monarch.grad_function
        def scale(x, k):
            def backward(g):
                return g * k, None
            return x * k, backward
    """

    @functools.wraps(fn)
    def apply(*args: Any, **kwargs: Any) -> Any:
        f = functools.partial(fn, **kwargs) if kwargs else fn
        return _GradFunction.apply(f, *args)

    return apply
