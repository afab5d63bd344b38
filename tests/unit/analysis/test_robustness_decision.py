"""The held-out decision options of the robustness grid (analysis/robustness_decision.py): the worst cell chosen on
selection seeds and read on evaluation seeds, clean utility as a non-inferiority test with its power, and the
published output unchanged when the keys are absent."""

from __future__ import annotations

import hashlib
import math
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats
from statsmodels.stats.power import TTestPower
from statsmodels.stats.weightstats import DescrStatsW

from resfl_lightning.analysis.experiment import ExperimentError
from resfl_lightning.analysis.robustness import RobustnessGrid
from resfl_lightning.analysis.robustness_criteria import decide
from resfl_lightning.analysis.robustness_decision import check_seeds_run, held_out_seeds
from resfl_lightning.analysis.robustness_grid import CLEAN, Cell, grid_cells, load_grid, select
from resfl_lightning.analysis.robustness_report import figure_axes, markdown
from resfl_lightning.analysis.robustness_results import cell_results, worst_case, worst_cell

SEEDS = [0, 1, 2, 3, 4]
CLEAN_U = [0.85, 0.84, 0.86, 0.85, 0.84]


def _values(table: dict) -> dict:
    return {(Cell(*k), s): {"utility": u, "eod": 0.0, "weight_share": 0.1}
            for k, utils in table.items() for s, u in enumerate(utils)}


def _grid(**decision) -> dict:
    grid = select(load_grid(), "core")
    grid["fractions"] = [0.2]
    grid["decision"] = {**grid["decision"], **decision}
    return grid


def _swapping_worst() -> dict:
    """resfl_robust's ALIE is its worst cell on seeds 0-1 and sign flip on seeds 2-4 (and over all five); FedAvg's
    sign flip is its worst everywhere."""
    return {
        ("fedavg", CLEAN, "honest", 0.0): CLEAN_U, ("resfl", CLEAN, "honest", 0.0): CLEAN_U,
        ("resfl_robust", CLEAN, "honest", 0.0): CLEAN_U,
        ("fedavg", "sign_flip", "honest", 0.2): [0.40, 0.42, 0.41, 0.43, 0.40],
        ("resfl_robust", "alie", "honest", 0.2): [0.70, 0.71, 0.83, 0.82, 0.83],
        ("resfl_robust", "sign_flip", "honest", 0.2): [0.80, 0.79, 0.76, 0.75, 0.76],
    }


def _results(table: dict) -> dict:
    return cell_results(_values(table), [Cell(*k) for k in table], SEEDS)


def _drops(attacked: list[float], seeds: list[int]) -> np.ndarray:
    return np.array([(CLEAN_U[s] - attacked[s]) / CLEAN_U[s] for s in seeds])


def test_the_worst_cell_is_chosen_on_the_selection_seeds_and_read_on_the_evaluation_seeds():
    table = _swapping_worst()
    res, grid = _results(table), _grid(selection_seeds=[0, 1], evaluation_seeds=[2, 3, 4])
    assert worst_cell(res, "resfl_robust", 0.2).cell.attack == "sign_flip"  # over all seeds
    assert worst_cell(res, "resfl_robust", 0.2, (2, 3, 4)).cell.attack == "sign_flip"
    chosen = worst_case(res, grid, "resfl_robust", 0.2)
    assert chosen.cell.attack == "alie" and set(chosen.ba_ad) == {2, 3, 4}  # chosen on 0-1, read on 2-4
    assert chosen.ba_ad == {s: pytest.approx(v) for s, v in zip([2, 3, 4], _drops(table[(
        "resfl_robust", "alie", "honest", 0.2)], [2, 3, 4]))}
    first = decide(res, grid)[0]
    ci = stats.ttest_1samp(_drops(table[("resfl_robust", "alie", "honest", 0.2)], [2, 3, 4]), 0).confidence_interval()
    assert f"[{ci.low:+.3f}, {ci.high:+.3f}] (n=3) (alie/honest)" in first.detail
    fed = _drops(table[("fedavg", "sign_flip", "honest", 0.2)], [2, 3, 4])
    rob = _drops(table[("resfl_robust", "alie", "honest", 0.2)], [2, 3, 4])
    gap = stats.ttest_1samp(fed - rob, 0).confidence_interval()
    assert f"fedavg - resfl_robust +{np.mean(fed - rob):.3f} [{gap.low:+.3f}, {gap.high:+.3f}] (n=3)" in first.detail
    assert first.detail.endswith("worst cells chosen on seeds 0, 1, evaluated on seeds 2, 3, 4")
    # without the keys: today's rule, the max of the means over every seed
    assert "(sign_flip/honest)" in decide(res, _grid())[0].detail and "chosen on" not in decide(res, _grid())[0].detail


def test_the_evaluation_interval_reads_no_selection_seed():
    table = _swapping_worst()
    grid = _grid(selection_seeds=[0, 1], evaluation_seeds=[2, 3, 4])
    before = decide(_results(table), grid)[0]
    table[("resfl_robust", "alie", "honest", 0.2)][:2] = [0.10, 0.20]  # worse still on the selection seeds only
    table[("fedavg", "sign_flip", "honest", 0.2)][:2] = [0.05, 0.06]
    after = decide(_results(table), grid)[0]
    assert after.detail == before.detail and after.passed == before.passed
    res = _results(table)
    text = markdown(res, grid, "# t", SEEDS)
    assert "chosen on seeds 0, 1, evaluated on seeds 2, 3, 4 (decision.selection_seeds / evaluation_seeds)" in text
    summary = text.split("## Worst case over attacks and report modes", 1)[1].split("## Clean runs", 1)[0]
    robust = next(line for line in summary.splitlines() if line.startswith("| resfl_robust |"))
    drops = _drops(table[("resfl_robust", "alie", "honest", 0.2)], [2, 3, 4])
    ci = stats.ttest_1samp(drops, 0).confidence_interval()
    # n = 3 is every evaluation seed, so it is not flagged as fewer than planned
    assert robust == f"| resfl_robust | {np.mean(drops):.3f} [{ci.low:.3f}, {ci.high:.3f}] alie/honest |"
    import matplotlib.pyplot as plt

    fig, ax = figure_axes(res, grid, "t")
    handles, labels = ax.get_legend_handles_labels()
    ys = {label: h.lines[0].get_ydata()[0] for h, label in zip(handles, labels) if label in grid["defences"]}
    plt.close(fig)
    assert ys["resfl_robust"] == pytest.approx(np.mean(_drops(table[("resfl_robust", "alie", "honest", 0.2)],
                                                              [2, 3, 4])))


def test_held_out_seeds_must_be_disjoint_paired_and_run():
    assert held_out_seeds(_grid()) is None
    with pytest.raises(ExperimentError, match=r"decision.selection_seeds and decision.evaluation_seeds share seeds "
                                              r"\[2\]"):
        held_out_seeds(_grid(selection_seeds=[0, 1, 2], evaluation_seeds=[2, 3, 4]))
    with pytest.raises(ExperimentError, match="decision.selection_seeds is given without decision.evaluation_seeds"):
        held_out_seeds(_grid(selection_seeds=[0, 1]))
    with pytest.raises(ExperimentError, match=r"decision.evaluation_seeds: at least 2 seed\(s\), got \[3\]"):
        held_out_seeds(_grid(selection_seeds=[0, 1], evaluation_seeds=[3]))
    with pytest.raises(ExperimentError, match="decision.selection_seeds: a list of integer seeds"):
        held_out_seeds(_grid(selection_seeds=3, evaluation_seeds=[3, 4]))
    with pytest.raises(ExperimentError, match="decision.evaluation_seeds: a seed appears twice"):
        held_out_seeds(_grid(selection_seeds=[0], evaluation_seeds=[3, 3]))
    with pytest.raises(ExperimentError, match=r"decision.evaluation_seeds: seeds \[5, 6\] are not among the seeds run"):
        check_seeds_run(_grid(selection_seeds=[0, 1], evaluation_seeds=[4, 5, 6]), SEEDS)
    check_seeds_run(_grid(selection_seeds=[0, 1], evaluation_seeds=[2, 3, 4]), SEEDS)
    # the experiment's seeds, read before it plans any run, refuse a held-out seed it would not train
    grid, ctx = _grid(selection_seeds=[0, 1], evaluation_seeds=[2, 3, 4]), SimpleNamespace(options={"seeds": 3})
    with pytest.raises(ExperimentError, match=r"decision.evaluation_seeds: seeds \[3, 4\]"):
        RobustnessGrid().seeds(ctx, grid)
    assert RobustnessGrid().seeds(SimpleNamespace(options={}), grid) == SEEDS
    with pytest.raises(ExperimentError, match="decision.clean_utility_test"):
        RobustnessGrid().seeds(SimpleNamespace(options={}), _grid(clean_utility_test="two_sided"))


def _clean_case(robust: list[float], resfl: list[float]) -> dict:
    return _results({("resfl_robust", CLEAN, "honest", 0.0): robust, ("resfl", CLEAN, "honest", 0.0): resfl})


def test_clean_utility_as_a_noninferiority_test_with_its_power():
    robust, resfl = [0.832, 0.842, 0.829, 0.845, 0.836], [0.850, 0.846, 0.851, 0.849, 0.842]
    d = np.array(robust) - 0.98 * np.array(resfl)
    utility = decide(_clean_case(robust, resfl), _grid(clean_utility_test="noninferiority"))[2]
    low, high = DescrStatsW(d).tconfint_mean(alpha=0.10)
    assert "one-sided paired t-test of the difference > 0, alpha = 0.05" in utility.text
    assert f"one-sided 95 % bounds [{low:+.3f}, {high:+.3f}]" in utility.detail
    assert utility.passed == (True if low > 0 else (False if high < 0 else None))
    p = DescrStatsW(d).ttest_mean(0.0, alternative="larger")[1]
    assert f"p = {p:.3g} (n=5)" in utility.detail
    # power at the observed paired SD if the utilities are equal: d = 0.02 x mean RESFL
    margin = 0.02 * np.mean(resfl)
    d_z = margin / d.std(ddof=1)
    need = max(2, math.ceil(TTestPower().solve_power(effect_size=d_z, alpha=0.05, power=0.8, alternative="larger")))
    power = TTestPower().power(effect_size=d_z, nobs=5, alpha=0.05, alternative="larger")
    assert f"(d = {margin:.4f}), at the paired SD {d.std(ddof=1):.4f} (d_z = {d_z:.2f}) 80 % power needs {need} " \
           f"seeds; these 5 give {100 * power:.0f} %" in utility.detail


def test_noninferiority_passes_fails_or_leaves_undecided_on_its_one_sided_bounds():
    ni = _grid(clean_utility_test="noninferiority")
    resfl = [0.850, 0.846, 0.851, 0.849, 0.842]
    assert decide(_clean_case([u * 0.995 for u in resfl], resfl), ni)[2].passed is True
    assert decide(_clean_case([u * 0.95 for u in resfl], resfl), ni)[2].passed is False
    # the "fail" 0.163 vs 0.168 with overlapping intervals: not shown either way at these seeds
    noisy = decide(_clean_case([0.163, 0.175, 0.150, 0.170, 0.157], [0.168, 0.160, 0.175, 0.166, 0.171]), ni)[2]
    assert noisy.passed is None and "power needs" in noisy.detail
    # one-sided 95 % (the 90 % interval) decides where the published two-sided 95 % interval does not
    # d = robust - 0.98 x resfl: mean 0.002, sd 0.002, t = 2.24, between t_{0.95,4} = 2.13 and t_{0.975,4} = 2.78
    robust = [0.98 * u + d for u, d in zip(resfl, [0.001, 0.004, -0.001, 0.003, 0.003])]
    published = decide(_clean_case(robust, resfl), _grid())[2]
    assert published.passed is None and decide(_clean_case(robust, resfl), ni)[2].passed is True
    text = markdown(_clean_case(robust, resfl), ni, "# t", SEEDS)
    assert "criterion 3 is a one-sided non-inferiority t-test at alpha = 0.05" in text
    assert "Held-out decision options" not in markdown(_clean_case(robust, resfl), _grid(), "# t", SEEDS)
    with pytest.raises(ExperimentError, match="decision.clean_utility_test: 'tost'; choose one of interval, "
                                              "noninferiority"):
        decide(_clean_case(robust, resfl), _grid(clean_utility_test="tost"))


def _synthetic(grid: dict, seeds: list[int]) -> dict:
    """Every cell of the grid, with a few unfinished runs; pseudo-random but fixed."""
    rng = np.random.default_rng(57)
    values = {}
    for i, c in enumerate(grid_cells(grid)):
        for s in seeds:
            if c.attack != CLEAN and (i + s) % 17 == 0:
                continue
            base = 0.85 if c.attack == CLEAN else 0.85 - rng.uniform(0.0, 0.4) * c.fraction
            values[(c, s)] = {"utility": float(base + rng.normal(0, 0.01)), "eod": float(rng.normal(0.05, 0.02)),
                              "weight_share": float(rng.uniform(0, 0.3)) if c.attack != CLEAN else None}
    return values


# sha256 of markdown() on _synthetic, rendered by the code before the options existed (main at 5fdb17c)
PUBLISHED = {None: "87b7f44d53c920aa6a8895880b53db5f47d8ab65685198bc41c1df837c335465",
             "n4": "4de1f94209ae6ed06b6787d3a41a202ebe5d442907100c29f7f76562cc6ccb52",
             "core": "babd1727ddc8a80c9b76c483e31bb6e474b378eea852f0f31af2afe749d6b684"}


@pytest.mark.parametrize("subset", list(PUBLISHED))
def test_absent_keys_render_the_published_markdown_byte_for_byte(subset):
    grid = select(load_grid(), subset)
    assert not {"selection_seeds", "evaluation_seeds", "clean_utility_test"} & set(grid["decision"])
    res = cell_results(_synthetic(grid, SEEDS), grid_cells(grid), SEEDS, grid)
    text = markdown(res, grid, "# t", SEEDS)
    assert hashlib.sha256(text.encode()).hexdigest() == PUBLISHED[subset]
    grid["decision"]["clean_utility_test"] = "interval"  # the default spelt out
    assert markdown(res, grid, "# t", SEEDS) == text
