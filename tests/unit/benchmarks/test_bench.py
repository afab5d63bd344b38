"""`resfl bench --quick`: every part runs at a tiny size and prints its rows with finite positive figures.

Only the machinery is checked: timings never go into assertions."""

from __future__ import annotations

import math
import re

import pytest

from resfl_lightning.benchmarks import dp_tabular
from resfl_lightning.benchmarks import round as bench_round
from resfl_lightning.benchmarks.steps import HELD_ROWS, REFRESH_ROW, ROI_ALIGN_ROWS, STEP_GOALS, VARIANTS
from resfl_lightning.cli import bench

pytestmark = pytest.mark.slow  # `resfl bench --quick` runs every part (child processes included): ~50 s

NUMBER = re.compile(r"^(-?\d[\d,]*(?:\.\d+)?|nan|inf)\s*(s|x)?$")


def _rows(text: str) -> dict[str, list[str]]:
    """Every printed table row, keyed by its first cell (rich's box-drawing layout)."""
    rows = {}
    for line in text.splitlines():
        if line.startswith("│"):
            cells = [c.strip() for c in line.strip("│").split("│")]
            rows[cells[0]] = cells[1:]
    return rows


def _number(cell: str) -> float:
    m = NUMBER.match(cell)
    assert m, f"not a number: {cell!r}"
    return float(m.group(1).replace(",", ""))


@pytest.fixture(scope="module")
def printed(tmp_path_factory) -> dict[str, list[str]]:
    mp = pytest.MonkeyPatch()
    mp.setenv("COLUMNS", "250")  # no wrapped cells
    mp.chdir(tmp_path_factory.mktemp("bench"))
    import contextlib
    import io

    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            bench.main(["--quick"])
    finally:
        mp.undo()
    return _rows(out.getvalue())


def _positive(cell: str) -> None:
    value = _number(cell)
    assert math.isfinite(value) and value > 0, cell


def test_round_overhead_devices_and_first_step_rows(printed):
    for label in bench_round.ROWS:
        assert label.strip() in printed, (label, sorted(printed))
        _positive(printed[label.strip()][0])
    assert re.fullmatch(r"<= 2\.5 s: (met|not met)", printed[bench_round.ROW_FIRST][1])
    assert re.fullmatch(r"<= 1\.5 s: (met|not met)", printed[bench_round.ROW_IMPORTS.strip()][1])
    assert printed[bench_round.ROW_PLAIN][1] == "8 steps"  # the same steps as the measured round (4 clients x 2)
    assert printed[bench_round.ROW_WALL2][1] == "2 processes (gloo)"
    assert re.fullmatch(r"<= 1\.03x: (met|not met)", printed[bench_round.ROW_OVERHEAD][1])
    assert re.fullmatch(r">= 1\.80x: (met|not met)", printed[bench_round.ROW_SPEEDUP][1])


def test_step_time_aggregation_and_scale_rows(printed):
    for variant in [*VARIANTS, *ROI_ALIGN_ROWS.values(), REFRESH_ROW[0], *(name for name, _ in HELD_ROWS)]:
        _positive(printed[variant][0])
        _positive(printed[variant][1])
    for cell in printed["64px, 2 images, 4 boxes"]:  # phi's box features: roi_align vs separable, and the ratio
        _positive(cell)
    for variant, goal in STEP_GOALS.items():
        for row in (variant, *([ROI_ALIGN_ROWS[variant]] if variant in ROI_ALIGN_ROWS else [])):
            assert re.fullmatch(rf"<= {goal:.2f}x: (met|not met)", printed[row][2]), printed[row]
    _positive(printed["seconds per folded client delta"][0])
    _positive(printed["throughput (client deltas folded per second)"][0])
    for n in ("4", "20"):  # N, k, steps, s/step, vs N=4, vs plain, s/client, vs N=4, states, RSS MB, RSS vs N=4, goal
        for cell in printed[n][:-1]:
            _positive(cell)
        assert printed[n][-1] == "-"  # the goal is the 10,000-client row's (bench_scale.scale_goal)


def test_dp_step_rows(printed):
    """The DP-SGD table: no DP, the image-by-image loss with opacus' optimizer, and the simulator's step; each a
    positive step time and its ratios against the first two."""
    labels = ("no DP-SGD", "DP-SGD before: loss image by image, opacus optimizer",
              "DP-SGD now: batched per-image loss, ClientDPOptimizer")
    for label in labels:
        assert label in printed, (label, sorted(printed))
        for cell in printed[label][:3]:
            _positive(cell)
    assert printed[labels[0]][1] == "1.00x" and printed[labels[1]][2] == "1.00x"


def test_tabular_dp_step_rows(printed):
    """The Adult-MLP DP-SGD table: no DP, opacus' per-sample gradient storage, the simulator's; ratios against both."""
    for label in dp_tabular.ROWS.values():
        assert label in printed, (label, sorted(printed))
        for cell in printed[label]:
            _positive(cell)
    assert printed[dp_tabular.ROWS["none"]][1] == "1.0x" and printed[dp_tabular.ROWS["opacus"]][2] == "1.00x"


def test_steps_part_on_a_chosen_precision(monkeypatch, tmp_path):
    """`resfl bench steps --quick --precision bf16-mixed`: the step table alone, every variant timed under autocast,
    no host-sync column off CUDA; an unknown precision is refused."""
    import contextlib
    import io

    monkeypatch.setenv("COLUMNS", "250")
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert bench.main(["steps", "--quick", "--precision", "bf16-mixed"]) == 0
    text = out.getvalue()
    assert "1 thread, bf16-mixed" in text and "host syncs" not in text
    rows = _rows(text)
    for variant in [*VARIANTS, *ROI_ALIGN_ROWS.values()]:
        _positive(rows[variant][0])
    with pytest.raises(SystemExit):
        bench.main(["steps", "--quick", "--precision", "fp8"])
