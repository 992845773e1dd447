"""A module the tensor workers import by name (``remote("tests_tensor_helpers.f")``)."""

import torch


def scale_by_path(x: torch.Tensor, factor: float) -> torch.Tensor:
    return x * factor
