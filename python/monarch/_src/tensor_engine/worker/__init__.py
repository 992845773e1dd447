"""The worker side of the tensor engine: what runs in each proc of an active mesh.

``actor`` is the ``TensorWorker`` actor (the value table, a handler per command record,
the stream threads); ``collectives`` its process groups, reductions and point-to-point
transfers; ``shm`` same-host all-reduces through shared memory; ``interop`` its side of
actor calls with tensors. Nothing here imports the client side
(:mod:`monarch._src.tensor_engine.client`): the two share only
:mod:`monarch._src.tensor_engine.wire` and :mod:`monarch._src.tensor_engine.errors`.
"""
