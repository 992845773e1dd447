"""The actor layer of monarch: meshes of actors, their shapes and the values they return.

Private: public names are re-exported from ``monarch.actor``.
"""

from monarch._src.actor import process as _process


def _bootstrap_root() -> _process.ProcessState:
    """Start the root client through the runtime, imported on first use: a program
    that imported only some of this package's modules (a function pickled by value
    imports just the ones it names) starts the actor API all the same. The runtime
    registers its own bootstrapper when it is imported, which replaces this one."""
    from monarch._src.actor.runtime import bootstrap_root

    return bootstrap_root()


_process.set_bootstrapper(_bootstrap_root)
