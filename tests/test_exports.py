"""Public modules declare exactly what they export (``__all__``)."""

import monarch


def test_monarch_all_is_complete() -> None:
    public = {name for name in vars(monarch) if not name.startswith("_")} - {"annotations"}
    exported = set(monarch.__all__)
    assert public <= exported, f"public names missing from __all__: {public - exported}"
    missing = [name for name in exported if not hasattr(monarch, name)]
    assert not missing, f"names in __all__ that monarch lacks: {missing}"
