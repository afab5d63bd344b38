"""Per-sample gradients stored without opacus' zero-filled copy (docs/performance.md, "A DP run on UCI Adult").

opacus' GradSampleModule hook hands every layer's per-sample gradients to
`opacus.grad_sample.grad_sample_module.create_or_accumulate_grad_sample`, which allocates a zero tensor of the
batch's size and copies the gradients into it. When the gradients already cover the whole batch and nothing was
stored yet, that copy equals the gradients themselves (0 + x = x, up to the sign of a zero, which no later sum,
clip or SGD step can tell apart), so `store` keeps the tensor the grad sampler returned. On Adult's MLP the fresh
zero-filled buffers of every step were a third of a DP run (page faults on ~70 MB a step). Every other case
(accumulation over a second forward of the same layer, a shorter batch, a tensor that views another) goes to
opacus' own function unchanged. The final models are bitwise the same (tests/unit/privacy/test_grad_sample_store.py).
A book-keeping placeholder (privacy/bookkeeping.py) is kept as it is, and materialised before opacus adds to or into it.
"""

from __future__ import annotations

import opacus.grad_sample.grad_sample_module as grad_sample_module
import torch

from resfl_lightning.privacy import bookkeeping

_OPACUS_STORE = grad_sample_module.create_or_accumulate_grad_sample
_OWNED = "_resfl_owned_grad_sample"  # set on a parameter whose _current_grad_sample is the sampler's own tensor


def store(*, param: torch.Tensor, grad_sample: torch.Tensor, max_batch_len: int) -> None:
    """opacus' create_or_accumulate_grad_sample without the zero-filled copy when it would be the identity."""
    if not param.requires_grad:
        return
    current = getattr(param, "_current_grad_sample", None)
    if bookkeeping.is_factored(grad_sample):
        if current is None and grad_sample.shape[0] == max_batch_len:
            param._current_grad_sample = grad_sample
            setattr(param, _OWNED, False)
            return
        grad_sample = bookkeeping.materialise(grad_sample)
    if current is not None and bookkeeping.is_factored(current):
        param._current_grad_sample = current = bookkeeping.materialise(current)  # a fresh tensor opacus may add into
        setattr(param, _OWNED, False)
    if current is None and grad_sample.shape[0] == max_batch_len and grad_sample._base is None:
        param._current_grad_sample = grad_sample
        setattr(param, _OWNED, True)
        return
    if current is not None and getattr(param, _OWNED, False):
        # opacus adds in place; the kept tensor is the sampler's, so add into a copy of it instead
        param._current_grad_sample = current.clone()
    setattr(param, _OWNED, False)
    _OPACUS_STORE(param=param, grad_sample=grad_sample, max_batch_len=max_batch_len)


def install() -> None:
    """Route opacus' hook through `store` (idempotent; the hook looks the function up at call time)."""
    grad_sample_module.create_or_accumulate_grad_sample = store


def uninstall() -> None:
    """opacus' own function again (the tests compare both)."""
    grad_sample_module.create_or_accumulate_grad_sample = _OPACUS_STORE
