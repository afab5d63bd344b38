"""A finished run's config and global model, loaded into a fresh client (for `resfl finetune` and `resfl export`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError

from resfl_lightning.resources import conf_dir

CONF_DIR = conf_dir()


def read_trained_config(run_dir: Path, dataset: str | None = None, overrides: Sequence[str] = ()) -> DictConfig:
    """The training run's composed config, optionally with another dataset group and KEY=VALUE overrides."""
    run_dir = Path(run_dir)
    candidates = [run_dir / "config.yaml", run_dir / ".hydra" / "config.yaml"]  # resolved values first
    path = next((p for p in candidates if p.is_file()), None)
    if path is None:
        raise FileNotFoundError(f"no run config in {run_dir}: expected {candidates[0]} or {candidates[1]} "
                                "(both written by `resfl train`)")
    cfg = OmegaConf.load(path)
    if dataset is not None:
        ds_path = CONF_DIR / "dataset" / f"{dataset}.yaml"
        if not ds_path.is_file():
            names = sorted(p.stem for p in (CONF_DIR / "dataset").glob("*.yaml"))
            raise FileNotFoundError(f"--dataset {dataset}: no {ds_path}; available: {', '.join(names)}")
        cfg.dataset = OmegaConf.load(ds_path)
    bad = [o for o in overrides if "=" not in o or o.startswith("=")]
    if bad:
        raise ValueError(f"overrides must look like KEY=VALUE, got {bad}")
    OmegaConf.set_struct(cfg, True)  # an override naming a key the run does not have is a typo: fail
    try:
        return OmegaConf.merge(cfg, OmegaConf.from_dotlist(list(overrides))) if overrides else cfg
    except ConfigKeyError as err:
        raise ValueError(f"override {err.full_key}: the run's config {path} has no such key") from None


def load_detection_run(run_dir: Path, dataset: str | None, overrides: Sequence[str], purpose: str
                       ) -> tuple[Path, DictConfig]:
    """(global model checkpoint, validated config) of a finished detection run whose data is present; `purpose` says
    in the error why a classification run does not fit."""
    from resfl_lightning.data.federated import instantiate_dataset
    from resfl_lightning.run_config.group_names import with_group_indices
    from resfl_lightning.run_config.load import load_config

    ckpt = Path(run_dir) / "checkpoints" / "last.pt"
    if not ckpt.is_file():
        raise FileNotFoundError(f"no global model at {ckpt}; train first (resfl train ...)")
    cfg = load_config(with_group_indices(read_trained_config(run_dir, dataset, overrides)))
    if cfg.dataset.task != "detection":
        raise ValueError(f"dataset {cfg.dataset.name!r} is a {cfg.dataset.task} task; {purpose}")
    instantiate_dataset(cfg.dataset).preflight()
    return ckpt, cfg


def build_trained_model(cfg: DictConfig, checkpoint: Path, fabric: Any = None) -> tuple[Any, Any, Any, Any]:
    """(data, client, layout, state): the run's splits (same seed), a fresh client of `cfg` holding the checkpoint's
    global model (on the fabric's device when one is given) and the checkpoint's ServerState."""
    from resfl_lightning.builders import build_client
    from resfl_lightning.data.federated import build_federated_data
    from resfl_lightning.env import seed_all
    from resfl_lightning.federation.checkpoint import load_checkpoint
    from resfl_lightning.federation.state import FlatLayout

    seed_all(cfg.seed)
    printer = fabric.print if fabric is not None else print
    data = build_federated_data(cfg.dataset, seed=cfg.seed, printer=printer,  # the run's splits (same seed)
                                device_type=fabric.device.type if fabric is not None else None)
    client = build_client(cfg, data)
    if fabric is not None:
        client = fabric.to_device(client)
        client.fabric = fabric
    layout = FlatLayout.of(client)
    state = load_checkpoint(checkpoint, restore_rng=False)
    if state.theta.numel() != layout.numel:
        raise ValueError(f"{checkpoint} holds {state.theta.numel()} values but the configured model has "
                         f"{layout.numel}; does the config (model.scale, dataset groups / classes) match the run?")
    layout.load(client, state.model_theta, state.int_buffers)
    return data, client, layout, state
