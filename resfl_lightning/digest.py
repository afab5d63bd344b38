"""A digest of tensors by their exact bits: the pinned checksums of fixed runs (benchmarks/checksums.py) and the
root split's memory of the updates it has evaluated in a round (federation/root.py)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import torch


def state_sha256(state: Mapping[str, torch.Tensor]) -> str:
    """sha256 over each tensor's key, dtype, shape and raw bytes, in sorted key order: equal for bitwise-equal
    tensors whatever the mapping's order or the file that held them; any changed bit (a -0.0, a NaN payload) differs."""
    digest = hashlib.sha256()
    for key in sorted(state):
        tensor = state[key].detach().to("cpu").contiguous()
        digest.update(f"{key}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())  # a byte view: bfloat16 and bool too
    return digest.hexdigest()
