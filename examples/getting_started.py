# Getting started with Monarch's actors: a tour of monarch.actor that runs in a few
# seconds on one machine. Run it with `python examples/getting_started.py`.
#
# docs/getting_started.md walks through this same code, block by block, and
# tests/test_docs_getting_started.py checks that the two agree and that this runs.

import asyncio

from monarch.actor import (
    Actor,
    ActorError,
    context,
    current_rank,
    endpoint,
    get_or_spawn_controller,
    this_host,
)

# Procs: four OS processes on this machine, in a mesh with one dimension, "gpus".

procs = this_host().spawn_procs(per_host={"gpus": 4})
print("procs:", procs.sizes)

# An actor: state, plus endpoints that callers reach through the mesh.


class Counter(Actor):
    def __init__(self, start: int) -> None:
        self.value = start

    @endpoint
    def incr(self, by: int = 1) -> int:
        self.value += by
        return self.value

    @endpoint
    def get_value(self) -> int:
        return self.value

    @endpoint
    def where(self) -> str:
        proc_rank = context().actor_instance.rank
        return f"actor {dict(proc_rank)} got this message as {dict(current_rank())}"

    @endpoint
    def fail(self) -> None:
        raise ValueError(f"counter {self.value} refuses")


counters = procs.spawn("counters", Counter, 10)

# Calling endpoints: call, call_one, choose, stream, broadcast.

print("call:", counters.incr.call().get().values())
print("call_one:", counters.slice(gpus=0).incr.call_one(5).get())
print("choose:", counters.get_value.choose().get())
for future in counters.get_value.stream():
    print("stream:", future.get())
counters.incr.broadcast(100)
print("after broadcast:", counters.get_value.call().get().values())

# ValueMesh: the replies of call(), one per actor, shaped like the mesh.

values = counters.get_value.call().get()
for point, value in values.items():
    print(f"  gpus={point['gpus']}: {value}")
print("values():", values.values())
print("item(gpus=2):", values.item(gpus=2))

# Slicing and reshaping meshes.

print("size:", counters.size(), "sizes:", counters.sizes)
grid = counters.split(gpus=("row", "col"), row=2)
print("split:", grid.sizes)
print("rename:", grid.rename(row="x", col="y").sizes)
print("flatten:", grid.flatten("all").sizes)
for line in grid.slice(row=1).where.call().get().values():
    print(" ", line)
for line in counters.slice(gpus=slice(1, 4, 2)).where.call().get().values():
    print(" ", line)

# An async actor; it gets a mesh as an argument and calls it.


class Summer(Actor):
    @endpoint
    async def total(self, counters: Counter) -> int:
        values = await counters.get_value.call()
        await asyncio.sleep(0.01)
        return sum(values.values())


summer = procs.slice(gpus=0).spawn("summer", Summer)
print("async total:", summer.total.call_one(counters).get())

# Errors: an exception in an endpoint comes back as an ActorError.

try:
    counters.slice(gpus=3).fail.call_one().get()
except ActorError as e:
    print(e)
print("still alive:", counters.slice(gpus=3).get_value.call_one().get())

# A controller: one named actor per client, that every actor can find.


class Registry(Actor):
    def __init__(self) -> None:
        self.names: list[str] = []

    @endpoint
    def register(self, name: str) -> None:
        self.names.append(name)

    @endpoint
    def registered(self) -> list[str]:
        return sorted(self.names)


class Worker(Actor):
    @endpoint
    def join(self) -> None:
        registry = get_or_spawn_controller("registry", Registry).get()
        registry.register.call_one(f"worker {current_rank()['gpus']}").get()


workers = procs.spawn("workers", Worker)
workers.join.call().get()
registry = get_or_spawn_controller("registry", Registry).get()
print("registered:", registry.registered.call_one().get())

# Stopping: an actor mesh, then the procs.

counters.stop().get()
try:
    counters.get_value.call().get()
except RuntimeError as e:
    print("after stop:", e)
procs.stop().get()
print("done")
