"""``monarch.grad_generator`` and ``monarch.grad_function``: the same gradients as
``torch.autograd.grad``, yielded one at a time and computed incrementally, on local
tensors and on monarch tensors."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch

import monarch
from monarch import grad_function, grad_generator
from monarch.actor import ProcMesh


def _mlp(sizes: list[int], seed: int = 0) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = []
    for a, b in itertools.pairwise(sizes):
        layers += [torch.nn.Linear(a, b), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers[:-1])


def _close(got: list[Any], want: list[Any]) -> None:
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if w is None:
            assert g is None, f"gradient {i}: expected None"
            continue
        assert g is not None, f"gradient {i}: got None"
        assert g.shape == w.shape, f"gradient {i}: shape {g.shape} != {w.shape}"
        torch.testing.assert_close(g, w, msg=f"gradient {i} differs")


@pytest.mark.parametrize(
    ("sizes", "batch"), [([3, 1], 1), ([5, 7, 3], 4), ([8, 16, 16, 4], 10), ([2, 9, 1], 33)]
)
def test_gradients_of_an_mlp_are_torch_autograd_grad(sizes: list[int], batch: int) -> None:
    model = _mlp(sizes)
    x = torch.randn(batch, sizes[0])
    loss = model(x).pow(2).mean()
    params = list(model.parameters())
    want = torch.autograd.grad(loss, params, retain_graph=True)
    got = list(grad_generator(loss, params[::-1]))[::-1]
    _close(got, list(want))
    assert all(p.grad is None for p in params), ".grad must not be touched"


def test_yields_in_the_order_asked() -> None:
    model = _mlp([4, 6, 5, 2])
    loss = model(torch.randn(3, 4)).sum()
    params = list(model.parameters())
    want = torch.autograd.grad(loss, params, retain_graph=True)
    order = [2, 0, 5, 3, 1, 4]  # not the order of the backward pass
    got = list(grad_generator(loss, [params[i] for i in order]))
    _close(got, [want[i] for i in order])


def test_shared_subgraph_several_roots_and_grad_roots() -> None:
    torch.manual_seed(1)
    w = torch.randn(4, 4, requires_grad=True)
    v = torch.randn(4, requires_grad=True)
    h = torch.tanh(torch.randn(3, 4) @ w)  # shared by both roots
    a = (h * v).sum(1)  # shape (3,)
    b = h.pow(2).sum()
    ga = torch.tensor([1.0, -2.0, 0.5])
    want = torch.autograd.grad([a, b], [w, v, h], [ga, torch.tensor(3.0)], retain_graph=True)
    got = list(grad_generator([a, b], [w, v, h], [ga, torch.tensor(3.0)]))
    _close(got, list(want))
    # grad_roots left out or None: ones (3 for the non-scalar root is explicit here)
    want = torch.autograd.grad([a, b], [v, w], [torch.ones(3), None], retain_graph=True)
    _close(list(grad_generator([a, b], [v, w])), list(want))
    _close(list(grad_generator([a, b], [v, w], [None])), list(want))


def test_a_parameter_used_twice_and_one_not_used() -> None:
    w = torch.randn(3, requires_grad=True)
    unused = torch.randn(2, requires_grad=True)
    x = torch.randn(5, 3)
    loss = ((x * w) @ w + w.sum() * w[0]).sum()
    want = torch.autograd.grad(loss, [w], retain_graph=True)
    got = list(grad_generator(loss, [unused, w, unused]))
    assert got[0] is None and got[2] is None  # as upstream: None, not zeros
    _close(got[1:2], list(want))


def test_intermediate_tensors_broadcast_and_dtype() -> None:
    torch.manual_seed(2)
    w = torch.randn(1, 4, requires_grad=True)  # broadcast in the forward pass
    d = torch.randn(4, dtype=torch.float64, requires_grad=True)
    x = torch.randn(6, 4)
    h = x * w
    y = torch.split(h.double() + d, 2)  # a multi-output node, one output unused
    loss = y[0].sum() + 2 * y[2].sum()
    want = torch.autograd.grad(loss, [h, w, d], retain_graph=True)
    got = list(grad_generator(loss, [h, w, d]))
    _close(got, list(want))


def test_the_backward_pass_is_incremental() -> None:
    ran: list[str] = []

    @grad_function
    def tagged(x: torch.Tensor, name: str) -> Any:
        def backward(g: torch.Tensor) -> torch.Tensor:
            ran.append(name)
            return g

        return x.clone(), backward

    model = _mlp([4, 8, 8, 2])
    first, mid, last = model[0], model[2], model[4]
    assert isinstance(first, torch.nn.Linear) and isinstance(mid, torch.nn.Linear)
    assert isinstance(last, torch.nn.Linear)
    x = torch.randn(5, 4)
    h = tagged(first(x), "first")
    h = model[3](model[2](model[1](h)))
    loss = tagged(last(h), "last").pow(2).sum()
    order = [last.weight, last.bias, mid.weight, mid.bias, first.weight, first.bias]
    gen = grad_generator(loss, order)
    total_before = gen.nodes_run
    next(gen)
    assert ran == ["last"], "the first layer's backward ran before the last layer's grad"
    after_first = gen.nodes_run
    rest = list(gen)
    assert ran == ["last", "first"]
    assert total_before == 0 and 0 < after_first < gen.nodes_run
    # every node ran once: the walk shares the work of all gradients
    assert len(rest) == 5
    n_nodes = len(_reachable_nodes(loss)) - 6  # the accumulators never run
    assert gen.nodes_run == n_nodes


def _reachable_nodes(t: torch.Tensor) -> set[Any]:
    seen: set[Any] = set()
    todo = [t.grad_fn]
    while todo:
        n = todo.pop()
        if n is None or n in seen:
            continue
        seen.add(n)
        todo.extend(f for f, _ in n.next_functions)
    return seen


def test_errors_say_what_to_do() -> None:
    w = torch.randn(2, requires_grad=True)
    with pytest.raises(ValueError, match=r"roots\[0\] does not require grad"):
        grad_generator(torch.ones(2).sum(), [w])
    with pytest.raises(TypeError, match=r"with_respect_to\[1\] is a str"):
        grad_generator((w * 2).sum(), [w, "w"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="at most one incoming gradient per root"):
        grad_generator((w * 2).sum(), [w], [None, None])


def test_grad_function_runs_the_continuation() -> None:
    calls: list[int] = []

    @grad_function
    def double_with_fake_grad(x: torch.Tensor, scale: torch.Tensor, *, bias: float) -> Any:
        def backward(g: torch.Tensor) -> tuple[torch.Tensor, None]:
            calls.append(1)
            return g * scale * 10, None

        return x * scale + bias, backward

    x = torch.randn(3, requires_grad=True)
    s = torch.full((3,), 2.0)
    y = double_with_fake_grad(x, s, bias=1.0)
    torch.testing.assert_close(y, x.detach() * 2 + 1)
    (gx,) = torch.autograd.grad(y.sum(), [x])
    torch.testing.assert_close(gx, torch.full((3,), 20.0))
    assert calls == [1]
    y = double_with_fake_grad(x, s, bias=0.0)
    torch.testing.assert_close(next(grad_generator(y.sum(), [x])), torch.full((3,), 20.0))
    # a closed-over tensor changed in place after the forward pass is caught
    y = double_with_fake_grad(x, s, bias=0.0)
    s.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(y.sum(), [x])


def test_monarch_tensors_give_the_local_gradients(mesh: ProcMesh) -> None:
    model = _mlp([5, 7, 3], seed=3)
    x = torch.randn(4, 5)
    params = list(model.parameters())
    want = torch.autograd.grad(model(x).pow(2).mean(), params)
    with mesh.activate():
        remote = _mlp([5, 7, 3], seed=0)
        with torch.no_grad():
            for r, p in zip(remote.parameters(), params, strict=True):
                r.copy_(torch.tensor(p.detach().numpy()))
        loss = remote(torch.tensor(x.numpy())).pow(2).mean()
        gen = grad_generator(loss, list(remote.parameters())[::-1])
        got = [next(gen)]
        # the caller may leave another stream active: the backward stays on its own
        with monarch.Stream("other").activate():
            got += list(gen)
        got = got[::-1]
    assert all(isinstance(g, monarch.Tensor) and g.stream.name == "main" for g in got)
    _close(list(monarch.inspect(got, hosts=1, gpus=1)), list(want))
    _close(list(monarch.inspect(got)), list(want))
