"""The tensor engine: distributed tensors driven from one controller (``monarch.Tensor``).

Under ``proc_mesh.activate()`` every torch operation issued on the client is recorded
(output shapes come from a cache filled by shape inference on fake tensors, so no data
is computed on the client) and sent, in batches, to one tensor worker actor per proc,
which runs it with torch on its local shard. Values come back only when asked
(``fetch_shard``, ``inspect``). Collectives run among the workers over torch
process groups (gloo for CPU tensors, NCCL for CUDA tensors) whose rendezvous goes over
monarch's own messaging.

Parts, by side:

- :mod:`.wire`: the commands (one record type each) and the references in them, and
  :mod:`.errors`: ``RemoteException`` and the argument errors; both sides use them;
- :mod:`.client`: what runs in the program that drives the mesh (recording, shapes,
  batching, streams and borrows, the public functions, tensors in actor calls);
- :mod:`.worker`: what runs in each proc (the ``TensorWorker`` actor, its collectives,
  shared-memory all-reduces, its side of actor calls); it never imports the client;
- :mod:`.simulator` (with :mod:`.sim_model`): ``monarch.Simulator``, which reads the
  client's commands as a worker would, with no processes.

Guide: ``docs/tensors.md``.
"""

import importlib.util as _importlib_util

# Every way into distributed tensors (``monarch.Tensor`` and the other lazy names of
# ``monarch``, ``ProcMesh.activate()``, ``monarch.builtins``) imports this package first:
# without torch, say what to install instead of a bare "No module named 'torch'".
if _importlib_util.find_spec("torch") is None:
    raise ModuleNotFoundError(
        "monarch's distributed tensors need PyTorch, which is not installed in this "
        "Python environment: pip install torch (actors, meshes and monarch.rdma on CPU "
        "memory work without it)",
        name="torch",
    )
