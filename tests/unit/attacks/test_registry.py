"""An attack defined only in a tests module + a yaml outside conf/ is selected, composed and run: no library edit."""

from __future__ import annotations

import json

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from resfl_lightning.attacks.privacy_attacks import PrivacyAttacks
from resfl_lightning.attacks.registry import build_attack_callbacks
from resfl_lightning.attacks.robustness_attacks import ByzantineAttack, EqualizedOdds
from resfl_lightning.attacks.scores import AttackScores
from resfl_lightning.attacks.update_aia_attack import UpdateAttributeInference
from resfl_lightning.cli.train import CONF_DIR
from resfl_lightning.config import ConfigError
from tests.attack_plugin import UpdateNormProbe

PLUGIN_YAML = """\
# A user's attack: conf/attack/update_norm.yaml in their own config dir
update_norm:
  _target_: tests.attack_plugin.UpdateNormProbe
  scale: 2.0
"""


@pytest.fixture
def plugin_dir(tmp_path):
    (tmp_path / "conf" / "attack").mkdir(parents=True)
    (tmp_path / "conf" / "attack" / "update_norm.yaml").write_text(PLUGIN_YAML)
    return tmp_path / "conf"


def compose_with(plugin_dir, *overrides: str):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("train", overrides=[f"hydra.searchpath=[file://{plugin_dir}]", "logger=none", *overrides])


def test_a_new_attack_is_selected_alone_or_beside_others(plugin_dir):
    alone = build_attack_callbacks(compose_with(plugin_dir, "attack=update_norm"))
    assert [type(c) for c in alone] == [UpdateNormProbe, AttackScores] and alone[0].settings.scale == 2.0
    both = build_attack_callbacks(compose_with(plugin_dir, "attack=[privacy,update_norm,byzantine]",
                                               "attack.update_norm.scale=3"))
    assert [type(c) for c in both] == [ByzantineAttack, PrivacyAttacks, UpdateAttributeInference, EqualizedOdds,
                                       UpdateNormProbe, AttackScores]
    assert both[4].settings.scale == 3.0
    subset = build_attack_callbacks(compose_with(plugin_dir, "attack=[privacy,update_norm]",
                                                 "attack.enabled=[update_norm,eod]"))
    assert [type(c) for c in subset] == [EqualizedOdds, UpdateNormProbe, AttackScores]
    with pytest.raises(ConfigError, match=r"attack\.update_norm\.scale: .*Float"):
        build_attack_callbacks(compose_with(plugin_dir, "attack=update_norm", "attack.update_norm.scale=loud"))


def test_a_new_attack_runs_in_a_federation(plugin_dir, tmp_path):
    from resfl_lightning.builders import build_run

    run_dir = tmp_path / "run"
    cfg = compose_with(plugin_dir, "attack=update_norm", "progress=false", "model.scale=femto",
                       "dataset.num_images=40", "dataset.image_size=64", "dataset.extra_reserve_images=0",
                       f"dataset.cache_dir={tmp_path / 'cache'}", "federation.rounds=2", "eval.every=100",
                       f"run_dir={run_dir}")
    job = build_run(cfg)
    seen: dict[tuple[int, int], float] = {}

    class Spy:  # the updates as the callbacks receive them, to check the plugin's numbers against
        def on_client_end(self, round_idx, report, delta):
            seen[(round_idx, report.client_id)] = 2.0 * float(delta.double().norm())

    job.federation.fabric._callbacks.append(Spy())
    job.fit()
    torch.set_num_threads(1)
    probe = next(c for c in job.federation.fabric._callbacks if isinstance(c, UpdateNormProbe))
    assert sorted(probe.norms) == [(r, c) for r in range(2) for c in range(4)]
    assert probe.norms == pytest.approx(seen) and min(seen.values()) > 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for r, row in enumerate(rows):
        assert row["attack/update_norm"] == pytest.approx(sum(seen[(r, c)] for c in range(4)) / 4)
