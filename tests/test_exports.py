"""Public modules declare exactly what they export (``__all__``)."""

import types

import pytest

import monarch
import monarch.actor
import monarch.job


@pytest.mark.parametrize("module", [monarch, monarch.actor, monarch.job], ids=lambda m: m.__name__)
def test_all_is_complete(module: types.ModuleType) -> None:
    public = {
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    } - {"annotations"}
    exported = set(module.__all__)
    assert public <= exported, f"public names missing from __all__: {public - exported}"
    missing = [name for name in exported if not hasattr(module, name)]
    assert not missing, f"names in __all__ that {module.__name__} lacks: {missing}"


def test_actor_api_names_of_the_contract() -> None:
    """The names of upstream Monarch's public API that this release provides."""
    for name in [
        "Actor", "ActorError", "Endpoint", "Extent", "Future", "HostMesh", "Point",
        "ProcMesh", "ValueMesh", "as_endpoint", "concurrent_endpoint", "context",
        "Context", "current_actor_name", "current_rank", "current_size", "endpoint",
        "get_or_spawn_controller", "Port", "shutdown_context", "this_host", "this_proc",
        "Channel", "PortReceiver", "send", "Accumulator", "MeshFailure",
        "unhandled_fault_hook", "attach",
    ]:  # fmt: skip
        assert name in monarch.actor.__all__, name
