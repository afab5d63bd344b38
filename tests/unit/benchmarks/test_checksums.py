"""The pinned runs' checksum: a function of the tensors' bits alone (not of the mapping's order or the file)."""

from __future__ import annotations

import torch

from resfl_lightning.benchmarks.checksums import final_model
from resfl_lightning.digest import state_sha256
from resfl_lightning.federation.checkpoint import ServerState, save_checkpoint


def _state() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {"theta": torch.randn(50, generator=gen), "int_buffers/bn.num_batches_tracked": torch.tensor(3),
            "half": torch.randn(2, 3, generator=gen).to(torch.bfloat16), "mask": torch.tensor([True, False])}


def test_equal_tensors_give_equal_checksums_whatever_the_key_order():
    a = _state()
    b = {k: v.clone() for k, v in reversed(list(a.items()))}
    assert list(a) != list(b)
    assert state_sha256(a) == state_sha256(b)


def test_one_ulp_changes_the_checksum():
    a = _state()
    b = dict(a, theta=a["theta"].clone())
    b["theta"][17] = torch.nextafter(b["theta"][17], torch.tensor(float("inf")))
    assert state_sha256(a) != state_sha256(b)


def test_bits_not_values_count():
    # -0.0 == 0.0, but a pinned checkpoint with one in place of the other is not the same file
    assert state_sha256({"x": torch.zeros(3)}) != state_sha256({"x": -torch.zeros(3)})


def test_key_dtype_and_shape_are_part_of_the_checksum():
    x = torch.arange(6, dtype=torch.int32)
    base = state_sha256({"x": x})
    assert base != state_sha256({"y": x})
    assert base != state_sha256({"x": x.reshape(2, 3)})
    assert base != state_sha256({"x": x.view(torch.float32)})  # same bytes, another dtype


def test_a_view_hashes_as_its_values():
    x = torch.arange(12.0).reshape(3, 4)
    assert state_sha256({"x": x.t()}) == state_sha256({"x": x.t().contiguous()})


def test_final_model_reads_the_model_not_the_rest_of_the_checkpoint(tmp_path):
    theta = torch.randn(10)
    state = ServerState(round_idx=1, theta=theta, int_buffers={"bn.num_batches_tracked": torch.tensor(4)},
                        logger_run_id="abc")
    save_checkpoint(tmp_path / "a" / "checkpoints" / "last.pt", state)
    state.logger_run_id, state.round_idx = "xyz", 2
    torch.manual_seed(123)  # another RNG state in the file
    save_checkpoint(tmp_path / "b" / "checkpoints" / "last.pt", state)
    a, b = final_model(tmp_path / "a"), final_model(tmp_path / "b")
    assert sorted(a) == ["int_buffers/bn.num_batches_tracked", "theta"]
    assert state_sha256(a) == state_sha256(b)


def test_final_model_is_the_swa_average_once_swa_started(tmp_path):
    theta, swa = torch.zeros(4), torch.ones(4)
    save_checkpoint(tmp_path / "checkpoints" / "last.pt",
                    ServerState(round_idx=3, theta=theta, int_buffers={}, swa=swa, swa_count=2))
    assert torch.equal(final_model(tmp_path)["theta"], swa)
