"""The machine a run is recorded on names what decides its floats: the same lock on another CPU ISA trains other bits
(FedAvg on Adult, seed 0, one commit: test accuracy 0.85060 with MKL at AVX-512, 0.85133 at AVX2; docs/design.md,
Invariants), and the ledger's machine said only "x86_64, 2 CPUs" for both."""

from __future__ import annotations

from pathlib import Path

import torch

from resfl_lightning.analysis.checkout import cpu_model, machine


def test_the_machine_names_the_cpu_model_and_the_kernels_torch_dispatches_to():
    text = machine()
    assert torch.backends.cpu.get_cpu_capability() in text and f"torch {torch.__version__}" in text
    assert f"({cpu_model()})" in text


def test_the_cpu_model_is_read_from_cpuinfo(tmp_path: Path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9654 96-Core Processor\n")
    assert cpu_model(info) == "AMD EPYC 9654 96-Core Processor"
    assert cpu_model(tmp_path / "absent")  # elsewhere: platform's name for it, never an error
