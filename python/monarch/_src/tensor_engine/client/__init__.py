"""The client side of the tensor engine: what runs in the program that drives the mesh.

Bottom to top: ``stream`` (streams and borrows), ``engine`` (one ``Engine`` per proc
mesh: refs, views, batching, the flusher thread, the controller actor), ``tensor``
(``monarch.Tensor`` and recording), ``coalescing``, ``api`` (the public functions),
``interop`` (tensors in actor calls), ``grad``, ``opaque``, ``builtins_impl``; ``_torch``
holds every semi-private torch API the client relies on. The client sends the workers
the records of :mod:`monarch._src.tensor_engine.wire`.
"""
