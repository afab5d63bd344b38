"""Rules that tie several keys of one section together, one named function each: a section lists its rules in
`checks` and each takes the built section. Rules across the run's sections are run_config/rules.py's. Each raises
ConfigError "<the key to change>: <why>"."""

from __future__ import annotations

from typing import Any

from resfl_lightning.config.errors import ConfigError


def _fail(key: str, message: str) -> None:
    raise ConfigError(f"{key}: {message}", key)


def ufm_clip_order(u: Any) -> None:
    if u.clip_low > u.clip_high:
        _fail("ufm.clip_low", f"must be <= ufm.clip_high, got [{u.clip_low}, {u.clip_high}]")


def ufm_gate_off_needs_absolute_mode(u: Any) -> None:
    """A relative gate ignores ufm.gate, so gate=null there would silently keep gating."""
    if u.gate is None and u.gate_mode == "relative":
        _fail("ufm.gate", "null turns the gate off only with ufm.gate_mode=absolute; the relative gate ignores "
              "ufm.gate (set ufm.gate_mode=absolute ufm.gate=null to switch gating off)")


def loader_workers(loader: Any) -> None:
    if loader.num_workers == 0 and loader.persistent_workers:
        _fail("dataset.loader.persistent_workers", "needs dataset.loader.num_workers > 0")
    if loader.num_workers == 0 and loader.prefetch_factor is not None:
        _fail("dataset.loader.prefetch_factor", "needs dataset.loader.num_workers > 0 (or null)")


def fabric_devices(fabric: Any) -> None:
    d = fabric.devices
    ok = (isinstance(d, int) and not isinstance(d, bool) and d >= 1) or (isinstance(d, str) and d.strip() != "") or (
        isinstance(d, (list, tuple)) and len(d) > 0 and all(isinstance(i, int) and not isinstance(i, bool) for i in d))
    if not ok:
        _fail("fabric.devices", f"must be an integer >= 1, 'auto' or a list of device ids, got {d!r}")


def swa_start_value(a: Any) -> None:
    s = a.swa_start
    if s is not None and not ((isinstance(s, int) and s >= 0) or (isinstance(s, float) and 0 < s < 1)):
        _fail("algorithm.swa_start", f"must be a round (integer >= 0), a fraction of the rounds in (0, 1) or null, "
              f"got {s!r}")


def swa_lr_pair(a: Any) -> None:
    if (a.swa_lr_high is None) != (a.swa_lr_low is None):
        _fail("algorithm.swa_lr_low", "algorithm.swa_lr_high and algorithm.swa_lr_low must both be set or both be null")
    if a.swa_lr_high is not None and not a.swa_lr_low <= a.swa_lr_high:
        _fail("algorithm.swa_lr_low", f"must be <= algorithm.swa_lr_high, got {a.swa_lr_low} > {a.swa_lr_high}")


def dp_budget(dp: Any) -> None:
    if (dp.target_epsilon is None) == (dp.noise_multiplier is None):
        _fail("algorithm.dp", "set exactly one of target_epsilon and noise_multiplier "
              f"(got {dp.target_epsilon} and {dp.noise_multiplier})")


def dp_epsilon_split(dp: Any) -> None:
    """PUFFLE's epsilon_SGD + epsilon_stat + epsilon_lambda (privacy/budget.py): shares of target_epsilon."""
    s = dp.epsilon_split
    if s is None:
        return
    if dp.target_epsilon is None:
        _fail("algorithm.dp.epsilon_split", "needs algorithm.dp.target_epsilon (a fixed noise_multiplier has no "
              "epsilon to split)")
    if len(s) != 3 or s[0] <= 0 or abs(sum(s) - 1.0) > 1e-9:
        _fail("algorithm.dp.epsilon_split", f"must be three shares [sgd, stat, lambda] >= 0 summing to 1 with "
              f"sgd > 0, got {list(s)}")


def tunable_lambda_budget(a: Any) -> None:
    """PUFFLE: under DP the tunable lambda's batch gap is released every step; it needs its own epsilon share."""
    split = a.dp.epsilon_split
    if a.lambda_mode == "tunable" and a.dp.enabled and (split is None or not split[2] > 0):
        _fail("algorithm.dp.epsilon_split", "lambda_mode=tunable under DP needs an epsilon_lambda share > 0 (the "
              f"paper's 4 + 0.5 + 0.5: [0.8, 0.1, 0.1]), got {None if split is None else list(split)}")


def parity_fallback_budget(a: Any) -> None:
    """PUFFLE: under DP the shared counts are paid from epsilon_stat; the key only asks for exact counts without DP."""
    split = a.dp.epsilon_split
    if a.parity_global_fallback and a.dp.enabled and (split is None or not split[1] > 0):
        _fail("algorithm.parity_global_fallback", "under DP the fallback's counts need an epsilon_stat share > 0 "
              f"(algorithm.dp.epsilon_split, e.g. [0.8, 0.1, 0.1]), got {None if split is None else list(split)}")


def temperature_grid_nonempty(section: Any) -> None:
    if len(section.temperatures) == 0:
        _fail(f"{section.section}.temperatures", "must list at least one temperature")


def dim_range_interval(ds: Any) -> None:
    if len(ds.dim_range) != 2 or not 0 < ds.dim_range[0] <= ds.dim_range[1]:
        _fail("dataset.dim_range", f"must be [low, high] with 0 < low <= high, got {list(ds.dim_range)}")
