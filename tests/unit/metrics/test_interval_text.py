"""The one formatter of a mean and its interval (every results file writes intervals through it)."""

from __future__ import annotations

from scipy import stats

from resfl_lightning.metrics.intervals import Interval, interval_text
from resfl_lightning.metrics.statistics import t_test


def test_a_mean_and_its_student_t_interval_by_hand():
    values = [0.80, 0.82, 0.84]
    ci = stats.ttest_1samp(values, 0).confidence_interval(0.95)
    t = t_test(values)
    assert interval_text(t) == f"0.820 [{ci.low:.3f}, {ci.high:.3f}]"
    assert interval_text(t, 4, signed=True) == f"+0.8200 [+{ci.low:.4f}, +{ci.high:.4f}]"
    assert interval_text(Interval.of(t), sd=True) == f"0.820 ± 0.020 [{ci.low:.3f}, {ci.high:.3f}]"
    assert Interval.of(t).fmt() == interval_text(Interval.of(t), sd=True)


def test_one_value_is_its_mean_and_none_is_n_a():
    assert interval_text(t_test([0.5])) == "0.500" and interval_text(t_test([0.5]), point_alone=False) == "n/a"
    assert interval_text(t_test([-0.25]), signed=True) == "-0.250"
    assert interval_text(t_test([])) == "n/a" and Interval.of(t_test([])).fmt() == "n/a"


def test_mean_sd_text_by_hand():
    from resfl_lightning.metrics.intervals import mean_sd_text

    # mean 2, sample sd sqrt(((1-2)^2 + (3-2)^2) / 1) = sqrt(2); NaN and None are skipped
    assert mean_sd_text([1.0, None, 3.0, float("nan")]) == f"2.000 ± {2 ** 0.5:.3f}"
    assert mean_sd_text([0.25]) == "0.250"
    assert mean_sd_text([None, float("nan")]) == "n/a"
    assert mean_sd_text(iter([1.0, 2.0]), digits=1) == "1.5 ± 0.7"
