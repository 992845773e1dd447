"""The tensor engine: distributed tensors driven from one controller (``monarch.Tensor``).

Under ``proc_mesh.activate()`` every torch operation issued on the client is recorded
(output shapes come from a cache filled by shape inference on fake tensors, so no data
is computed on the client) and sent, in batches, to one tensor worker actor per proc,
which runs it with torch on its local shard. Values come back only when asked
(``fetch_shard``, ``inspect``). Collectives run among the workers over torch
process groups (gloo for CPU tensors, NCCL for CUDA tensors) whose rendezvous goes over
monarch's own messaging.

Modules:

- :mod:`.wire`: the commands and the references in them (shared by both sides);
- :mod:`.errors`: ``RemoteException`` and the argument errors;
- :mod:`._torch`: every semi-private torch API the engine relies on;
- :mod:`.tensor`: ``monarch.Tensor`` and recording;
- :mod:`.engine`: the client side: batching, references, the controller actor;
- :mod:`.worker`: the tensor worker actor;
- :mod:`.api`: the public functions (``fetch_shard``, ``reduce``, ``remote``, ...).

Guide: ``docs/tensors.md``.
"""
