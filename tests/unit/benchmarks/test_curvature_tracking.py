"""`resfl bench curvature`: observing the estimators leaves the trajectory as it is, and what they read is a share
of the reference eigenvalue (a Rayleigh quotient: at most 1 up to the reference's own tolerance)."""

from __future__ import annotations

import torch

from resfl_lightning.benchmarks import curvature_tracking


def test_observing_the_estimators_leaves_the_trajectory_bitwise_and_reads_rayleigh_quotients():
    torch.set_num_threads(1)
    observed, client = curvature_tracking.tracking("femto", 64, 2, 4, batches=1, reference_tol=1e-6,
                                                   reference_iters=200)
    _, plain = curvature_tracking.tracking("femto", 64, 2, 4, batches=1, observe=False)
    for a, b in zip(client.parameters(), plain.parameters(), strict=True):
        assert torch.equal(a, b)
    assert len(observed.references) == 4 and min(observed.references) > 0
    shares = observed.shares
    assert set(shares) == set(curvature_tracking.ESTIMATORS)
    for name, read in shares.items():
        assert all(0 < share <= 1 + 1e-3 for _, share in read), (name, read)
    converged = [share for _, share in shares["converged (curv_iters=3, the default)"]]
    assert len(converged) == 4 and min(converged) > 0.9  # one batch: the Fisher moves only with the parameters
    rendered = curvature_tracking.table(observed, skip=1)
    assert rendered.row_count == len(curvature_tracking.ESTIMATORS)


def test_the_command_prints_one_row_per_estimator(capsys, monkeypatch):
    from resfl_lightning.cli import bench

    monkeypatch.setenv("COLUMNS", "200")
    assert bench.main(["curvature", "--quick"]) == 0
    printed = capsys.readouterr().out
    for name in curvature_tracking.ESTIMATORS:
        assert name in printed
