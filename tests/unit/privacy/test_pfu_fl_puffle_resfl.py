"""Why PUFFLE-RESFL's DP curve equals PFU-FL's bit for bit on the detection benchmark (docs/method.md §5, the DP
curves): at the same epsilon the two presets differ only in the aggregation rule (size-weighted FedAvg against
uniform), and on equal client shards the two rules compute the same numbers. Both keep L_fair (w_fair 0.1): the
regulariser is not lost under DP. A change that made them differ otherwise, or the rules differ on equal sizes,
fails here."""

from __future__ import annotations

import torch

from resfl_lightning.analysis.dp_curve import epsilon_overrides
from resfl_lightning.analysis.run_settings import composed_settings, settings_diff
from tests.unit.aggregation.test_rules import aggregate, report


def test_at_one_epsilon_the_presets_differ_in_the_aggregation_alone():
    common = ["dataset=synthetic", "scenario=group_skew", "use_tuned=false", *epsilon_overrides(2.0)]
    puffle_resfl = composed_settings(["algorithm=puffle_resfl", *common])
    pfu_fl = composed_settings(["algorithm=pfu_fl", *common])
    keys = {line.split(":", 1)[0] for line in settings_diff(puffle_resfl, pfu_fl)}
    assert {k.split(".", 1)[0] for k in keys} <= {"aggregation", "algorithm", "run_name", "run_dir"}  # names
    assert {k for k in keys if k.startswith("algorithm.")} <= {"algorithm.name", "algorithm.table_order"}
    assert puffle_resfl["aggregation"]["_target_"].endswith(".FedAvg")
    assert pfu_fl["aggregation"]["_target_"].endswith(".Uniform")
    assert puffle_resfl["algorithm"]["w_fair"] == pfu_fl["algorithm"]["w_fair"] == 0.1


def test_fedavg_and_uniform_give_the_same_bits_on_equal_client_sizes():
    from resfl_lightning.aggregation.fedavg import FedAvg
    from resfl_lightning.aggregation.uniform import Uniform

    torch.manual_seed(0)
    deltas = [torch.randn(257) for _ in range(4)]
    equal = [report(i, n=126) for i in range(4)]
    assert torch.equal(aggregate(FedAvg(), equal, deltas), aggregate(Uniform(), equal, deltas))
    unequal = [report(i, n=n) for i, n in enumerate([126, 127, 126, 125])]
    assert not torch.equal(aggregate(FedAvg(), unequal, deltas), aggregate(Uniform(), unequal, deltas))
