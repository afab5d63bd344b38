"""Wiring of the attacks (SPEC §7) into a federated run: settings, reserve splits, the shadow model, per-sample
feature extraction, the Byzantine update transform and the data-poisoning wrapper.

Threat model: an honest-but-curious server that sees every client update and the final global model, and holds the
attack reserve (5% of the data, disjoint from every client and from the test split) as auxiliary data. The pure
attack functions live beside this module (mia.py, aia.py, update_features.py, byzantine.py, poisoning.py); this
module only turns a client model plus loaders into their inputs. See the callbacks (callbacks/privacy.py,
callbacks/update_aia.py, callbacks/robustness.py) for when each piece runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torchvision.ops import batched_nms

from resfl_lightning.attacks.byzantine import byzantine_transform, choose_attackers
from resfl_lightning.attacks.mia import classification_mia_features, detection_mia_features
from resfl_lightning.attacks.poisoning import MODES, is_poison_round, poison_annotations, poisoned_clients
from resfl_lightning.attacks.update_features import dominant_group
from resfl_lightning.config import ConfigError
from resfl_lightning.data.partition import stratified_split

ATTACKS = ("mia", "aia", "update_aia", "byzantine", "poisoning", "eod")
_SHADOW_STREAM = 0x534844  # RNG stream tags: attack randomness never reuses a training stream
_MEMBER_STREAM = 0x4D454D
_RESERVE_STREAM = 0x525356
_POISON_SEED_STREAM = 0x504F53


# --- settings ----------------------------------------------------------------------------------------------------
@dataclass
class ProbeSettings:
    """The two-layer MLP attribute probe of SPEC §7."""

    hidden: int = 128
    dropout: float = 0.1
    lr: float = 1e-3
    epochs: int = 10
    batch_size: int = 256


@dataclass
class MiaSettings:
    """Reserve = shadow members | shadow non-members | held-back target non-members (fractions of the reserve)."""

    shadow_member_fraction: float = 1 / 3
    shadow_nonmember_fraction: float = 1 / 3
    score_threshold: float = 0.25  # tau: the post-NMS detections the features describe
    calibration: str = "sigmoid"


@dataclass
class AiaSettings:
    boxes: str = "matched"  # matched | ground_truth
    score_threshold: float = 0.25  # detections entering the fairness matching
    min_matched: int = 20  # fewer matched persons than this -> ROIs at the ground-truth person boxes instead
    probe: ProbeSettings = field(default_factory=ProbeSettings)


@dataclass
class UpdateAiaSettings:
    top_k: int = 1000
    head_prefixes: list[str] | None = None  # null: the model's detection head (or its last layer)
    min_samples: int = 10
    probe: ProbeSettings = field(default_factory=ProbeSettings)


@dataclass
class ByzantineSettings:
    fraction: float = 0.25
    gamma: float = 1.0
    l2_bound: float | None = None
    include_buffers: bool = False  # flip BatchNorm running statistics too (can make variances negative)


@dataclass
class PoisoningSettings:
    fraction: float = 0.25
    target_group: int = 2
    mode: str = "drop"  # drop | mislabel | relabel_group
    rate: float = 1.0  # fraction of the target group's boxes poisoned on a poisoned client
    other_group: int | None = None  # relabel_group: the group the target persons are relabelled to
    mislabel_class: int | None = None  # mislabel: the (non-person) class given to the target persons
    start_round: int = 0
    length: int | None = None  # rounds in the block; null = until the end of training


@dataclass
class EodSettings:
    protected_group: int | None = None  # null: poisoning.target_group
    unprotected_group: int | None = None  # null: every other known group, pooled


@dataclass
class AttackSettings:
    enabled: tuple[str, ...] = ()
    every: int | None = None  # also run MIA / AIA every k rounds (always after the last round)
    mia: MiaSettings = field(default_factory=MiaSettings)
    aia: AiaSettings = field(default_factory=AiaSettings)
    update_aia: UpdateAiaSettings = field(default_factory=UpdateAiaSettings)
    byzantine: ByzantineSettings = field(default_factory=ByzantineSettings)
    poisoning: PoisoningSettings = field(default_factory=PoisoningSettings)
    eod: EodSettings = field(default_factory=EodSettings)

    def __post_init__(self) -> None:
        unknown = [a for a in self.enabled if a not in ATTACKS]
        if unknown:
            raise ConfigError(f"attack.enabled: unknown attack(s) {unknown}; choose from {list(ATTACKS)}")
        if self.every is not None and self.every < 1:
            raise ConfigError(f"attack.every must be null or >= 1, got {self.every}")
        m = self.mia
        if not (0 < m.shadow_member_fraction and 0 < m.shadow_nonmember_fraction
                and m.shadow_member_fraction + m.shadow_nonmember_fraction < 1):
            raise ConfigError("attack.mia.shadow_member_fraction / shadow_nonmember_fraction must be > 0 and sum to "
                              f"< 1 (the rest are target non-members), got {m.shadow_member_fraction}, "
                              f"{m.shadow_nonmember_fraction}")
        if m.calibration not in ("sigmoid", "isotonic"):
            raise ConfigError(f"attack.mia.calibration must be sigmoid or isotonic, got {m.calibration!r}")
        if self.aia.boxes not in ("matched", "ground_truth"):
            raise ConfigError(f"attack.aia.boxes must be matched or ground_truth, got {self.aia.boxes!r}")
        b = self.byzantine
        if not 0 <= b.fraction <= 1:
            raise ConfigError(f"attack.byzantine.fraction must be in [0, 1], got {b.fraction}")
        if not (b.gamma > 0 and math.isfinite(b.gamma)):
            raise ConfigError(f"attack.byzantine.gamma must be > 0, got {b.gamma}")
        if b.l2_bound is not None and not b.l2_bound > 0:
            raise ConfigError(f"attack.byzantine.l2_bound must be null or > 0, got {b.l2_bound}")
        p = self.poisoning
        if not 0 <= p.fraction <= 1:
            raise ConfigError(f"attack.poisoning.fraction must be in [0, 1], got {p.fraction}")
        if p.mode not in MODES:
            raise ConfigError(f"attack.poisoning.mode must be one of {list(MODES)}, got {p.mode!r}")
        if not 0 <= p.rate <= 1:
            raise ConfigError(f"attack.poisoning.rate must be in [0, 1], got {p.rate}")
        if p.start_round < 0 or (p.length is not None and p.length < 0):
            raise ConfigError(f"attack.poisoning.start_round / length must be >= 0, got {p.start_round}, {p.length}")

    def on(self, name: str) -> bool:
        return name in self.enabled

    @property
    def protected_group(self) -> int:
        return self.poisoning.target_group if self.eod.protected_group is None else self.eod.protected_group

    def due(self, round_idx: int, rounds: int) -> bool:
        """MIA / AIA rounds: the last round, and every `every` rounds when set."""
        return round_idx == rounds - 1 or (self.every is not None and (round_idx + 1) % self.every == 0)


def _build(cls: type, values: Mapping[str, Any] | None, path: str) -> Any:
    """Dataclass from a config mapping; an unknown key is a ConfigError naming it."""
    values = dict(values or {})
    kwargs = {}
    names = {f.name: f for f in dataclasses.fields(cls)}
    for key, val in values.items():
        if key not in names:
            raise ConfigError(f"{path}.{key}: unknown setting; known: {sorted(names)}")
        sub = names[key].default_factory if names[key].default_factory is not dataclasses.MISSING else None
        kwargs[key] = _build(sub, val, f"{path}.{key}") if dataclasses.is_dataclass(sub) else val
    return cls(**kwargs)


def attack_settings(node: Any) -> AttackSettings:
    """AttackSettings from the `attack` config node (DictConfig or mapping; None = nothing enabled)."""
    if node is None:
        return AttackSettings()
    if hasattr(node, "_metadata"):  # DictConfig
        from omegaconf import OmegaConf

        node = OmegaConf.to_container(node, resolve=True)
    values = dict(node)
    values["enabled"] = tuple(values.get("enabled") or ())
    return _build(AttackSettings, values, "attack")


# --- reproducible randomness ---------------------------------------------------------------------------------
def stream_seed(seed: int, *tags: int) -> int:
    """A 32-bit seed for one attack stage, independent of every training stream of the same run seed."""
    return int(np.random.SeedSequence([int(seed), *[int(t) for t in tags]]).generate_state(1)[0])


@contextlib.contextmanager
def isolated_rng(device: torch.device | None = None) -> Iterator[None]:
    """Run attack code without touching the run's torch / numpy / python RNG state (restored on exit)."""
    np_state, py_state = np.random.get_state(), random.getstate()
    devices = [device] if device is not None and device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)


# --- data helpers ------------------------------------------------------------------------------------------------
def base_data(data: Any) -> Any:
    """The federated data under any attack wrapper (PoisonedData)."""
    while isinstance(data, PoisonedData):
        data = data.base
    return data


def item_groups(data: Any) -> np.ndarray:
    """One group per item (image: its most frequent known person group, -1 if none), for stratified splits."""
    data = base_data(data)
    if hasattr(data, "item_groups"):
        return np.asarray(data.item_groups(), dtype=np.int64)
    if hasattr(data, "source") and hasattr(data.source, "annotations"):
        from resfl_lightning.data.partition import image_groups

        ann = data.source.annotations
        return image_groups(ann.image_index, ann.groups, len(data.source))
    if hasattr(data, "groups"):  # one row per item (tabular)
        return np.asarray(data.groups.cpu() if hasattr(data.groups, "cpu") else data.groups, dtype=np.int64)
    raise NotImplementedError(f"{type(data).__name__}: provide item_groups() for the attack reserve split")


def client_train_groups(data: Any, client_id: int) -> np.ndarray:
    """Sensitive groups of every labelled object in a client's *clean* training split (evaluation ground truth)."""
    data = base_data(data)
    if hasattr(data, "train_groups"):
        return np.asarray(data.train_groups(client_id), dtype=np.int64)
    if hasattr(data, "source") and hasattr(data.source, "annotations"):
        ann = data.source.annotations
        return ann.groups[np.isin(ann.image_index, data.splits.clients[client_id].train)]
    if hasattr(data, "groups"):
        return item_groups(data)[np.asarray(data.splits.clients[client_id].train, np.int64)]
    raise NotImplementedError(f"{type(data).__name__}: provide train_groups(client_id) for the update-aware AIA")


def client_dominant_group(data: Any, client_id: int) -> int:
    return dominant_group(client_train_groups(data, client_id), base_data(data).num_groups)


def train_loader_for(data: Any, indices: np.ndarray, seed: int):
    """A shuffled, augmented training loader over arbitrary items (the shadow model's training set)."""
    return base_data(data).train_loader_for(indices, seed=seed)


@dataclass(frozen=True)
class ReserveSplit:
    """The attack reserve cut three ways for the MIA (indices into the dataset)."""

    shadow_members: np.ndarray
    shadow_nonmembers: np.ndarray
    target_nonmembers: np.ndarray


def split_reserve(reserve: np.ndarray, groups: np.ndarray, settings: MiaSettings, seed: int) -> ReserveSplit:
    """Stratified (by item group) three-way split of the reserve; reproducible from the run seed."""
    reserve = np.asarray(reserve, np.int64)
    n = len(reserve)
    m = settings
    rng = np.random.default_rng(stream_seed(seed, _RESERVE_STREAM))
    rest, members = stratified_split(reserve, groups, m.shadow_member_fraction, rng)
    frac = m.shadow_nonmember_fraction * n / len(rest) if len(rest) else 0.0
    target, nonmembers = stratified_split(rest, groups, min(frac, 0.999), rng)
    return ReserveSplit(members, nonmembers, target)


def sample_members(data: Any, count: int, seed: int) -> np.ndarray:
    """`count` items drawn uniformly (seeded) from the union of every client's training split: target members."""
    splits = base_data(data).splits
    pool = np.sort(np.concatenate([c.train for c in splits.clients]))
    if count > len(pool):
        raise ValueError(f"need {count} member items but the clients hold {len(pool)} training items")
    rng = np.random.default_rng(stream_seed(seed, _MEMBER_STREAM))
    return np.sort(rng.choice(pool, size=count, replace=False))


# --- the shadow model --------------------------------------------------------------------------------------------
class ShadowModel:
    """One shadow client trained with the target's recipe (same client class, losses, optimiser, local epochs per
    round and lr schedule) on the reserve's shadow members, advanced round by round so that after `advance(r)` it
    has had exactly the r rounds of local epochs the target's data has had. It sees no aggregation: it is one client.
    """

    def __init__(self, federation: Any, indices: np.ndarray, seed: int):
        self.federation, self.indices, self.seed = federation, np.asarray(indices, np.int64), seed
        self.client = None
        self.rounds_done = 0

    def advance(self, rounds: int) -> Any:
        from resfl_lightning.federation.local import local_train

        fed = self.federation
        fabric, s = fed.fabric, fed.settings
        with isolated_rng(fabric.device):
            if self.client is None:
                torch.manual_seed(stream_seed(self.seed, _SHADOW_STREAM))
                self.client = fabric.to_device(fed.client_factory())
            for r in range(self.rounds_done, rounds):
                rseed = stream_seed(self.seed, _SHADOW_STREAM, r + 1)
                torch.manual_seed(rseed)
                self.client.begin_client(-1, r)
                local_train(fabric, self.client, lambda epoch, rs=rseed: train_loader_for(fed.data, self.indices,
                                                                                           rs + epoch),
                            s.local_epochs, lr_factor=s.lr_factor(r), name=f"shadow model, round {r}")
                self.rounds_done = r + 1
        return self.client


# --- per-sample outputs of a detection client ---------------------------------------------------------------------
@contextlib.contextmanager
def eval_mode(module: torch.nn.Module) -> Iterator[None]:
    was_training = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was_training)


def _to_device(fabric: Any, batch: dict) -> dict:
    return fabric.to_device(batch) if fabric is not None else batch


def _image_slice(out: dict, batch: dict, i: int) -> tuple[dict, dict]:
    """Raw model outputs and the ground truth of image i alone (a batch of one)."""
    out_i = {k: ([f[i:i + 1] for f in v] if isinstance(v, list) else v[i:i + 1]) for k, v in out.items()}
    sel = batch["batch_idx"].long() == i
    batch_i = {"img": batch["img"][i:i + 1], "batch_idx": torch.zeros_like(batch["batch_idx"][sel]),
               "cls": batch["cls"][sel], "bboxes": batch["bboxes"][sel], "groups": batch["groups"][sel]}
    return out_i, batch_i


def _kept_anchors(model: Any, out: dict, conf: float, iou: float, max_det: int) -> list[torch.Tensor]:
    """Per image, the anchor indices that EvidentialYOLO.predict keeps (same threshold, NMS and cap)."""
    dec = model.decode(out)
    alpha = dec["alpha"]
    probs = alpha[..., : model.num_classes] / alpha.sum(-1, keepdim=True)
    scores, labels = probs.max(-1)
    kept = []
    for i in range(alpha.shape[0]):
        cand = torch.nonzero(scores[i] > conf).flatten()
        idx = batched_nms(dec["boxes"][i][cand], scores[i][cand], labels[i][cand], iou)[:max_det]
        kept.append(cand[idx])
    return kept


def logit_margins(model: Any, out: dict, kept: Sequence[torch.Tensor]) -> torch.Tensor:
    """Per image: mean over its post-NMS detections of log alpha_label - log alpha_background (the Dirichlet
    log-evidence margin of the detected class over background); an image without detections uses its single
    highest-scoring anchor, so the feature is defined for every image."""
    alpha = model.decode(out)["alpha"]  # (B, A, C + 1), background last
    c = model.num_classes
    log_a = alpha.log()
    best_cls = log_a[..., :c].max(-1)  # the predicted class per anchor (= predict's label)
    margin = best_cls.values - log_a[..., c]  # (B, A)
    out_m = []
    for i, idx in enumerate(kept):
        if idx.numel():
            out_m.append(margin[i, idx].mean())
        else:
            out_m.append(margin[i, torch.argmax((alpha[i, :, :c] / alpha[i].sum(-1, keepdim=True)).max(-1).values)])
    return torch.stack(out_m) if out_m else torch.zeros(0)


@torch.no_grad()
def detection_outputs(client: Any, loader: Any, fabric: Any = None, score_threshold: float = 0.25) -> dict[str, Any]:
    """Eval-mode per-image outputs for the MIA: post-NMS predictions at tau, full task loss, logit margin, image ids.

    loss = the client's full detection task loss (CIoU box + Dirichlet NLL + DFL + NIG NLL, with its gains) of the
    image on its own ground truth; margin: see logit_margins().
    """
    model, iou, max_det = client.model, client.ufm.iou_threshold, client.max_det
    preds, losses, margins, ids = [], [], [], []
    with eval_mode(client):
        for batch in loader:
            batch = _to_device(fabric, batch)
            out = model(batch["img"])
            p = model.predict(out, conf=score_threshold, iou=iou, max_det=max_det)
            kept = _kept_anchors(model, out, score_threshold, iou, max_det)
            for i, (pi, ki) in enumerate(zip(p, kept)):
                if ki.numel() != pi["scores"].numel():
                    raise RuntimeError(f"image {int(batch['image_id'][i])}: NMS replay kept {ki.numel()} anchors, "
                                       f"predict() kept {pi['scores'].numel()}")
                out_i, batch_i = _image_slice(out, batch, i)
                losses.append(float(client.criterion.compute(out_i, batch_i).task))
            margins.append(logit_margins(model, out, kept).float().cpu())
            preds += [{k: v.detach().cpu() for k, v in d.items()} for d in p]
            ids.append(batch["image_id"].cpu())
    return {"preds": preds, "losses": np.asarray(losses, np.float64),
            "margins": torch.cat(margins).numpy().astype(np.float64) if margins else np.zeros(0),
            "image_ids": torch.cat(ids).numpy() if ids else np.zeros(0, np.int64)}


@contextlib.contextmanager
def attached_fabric(client: Any, fabric: Any) -> Iterator[None]:
    """Let a client's own collect() move batches to the device, without leaving it logging through Fabric."""
    previous = client._fabric
    client._fabric = fabric
    try:
        yield
    finally:
        client._fabric = previous


def classification_outputs(client: Any, loader: Any, fabric: Any = None) -> Any:
    """The classification client's eval-mode collect() (alpha, penultimate features, per-sample NLL, y, groups)."""
    if not hasattr(client, "collect"):
        raise NotImplementedError(f"{type(client).__name__} (task 'classification') needs collect(loader)")
    with attached_fabric(client, fabric if fabric is not None else client._fabric):
        return client.collect(loader)


def is_detection_client(client: Any) -> bool:
    return hasattr(client, "criterion") and hasattr(client, "person_features")


def mia_features(client: Any, loader: Any, fabric: Any = None, score_threshold: float = 0.25) -> np.ndarray:
    """Per-sample MIA feature matrix of a client on a loader (detection: 7 columns, classification: 6).

    Classification: [max prob, entropy, alpha0, u_cls, per-sample Dirichlet NLL, top-1 minus top-2 probability].
    """
    if is_detection_client(client):
        o = detection_outputs(client, loader, fabric, score_threshold)
        return detection_mia_features(o["preds"], o["losses"], o["margins"])
    pred = classification_outputs(client, loader, fabric)
    return classification_mia_features(pred.probs, pred.alpha0, pred.losses)


@torch.no_grad()
def representation_features(client: Any, loader: Any, fabric: Any = None, boxes: str = "matched",
                            score_threshold: float = 0.25, min_matched: int = 20) -> dict[str, Any]:
    """Neck features ROI-aligned and average-pooled per person, with the person's group (known groups only).

    boxes="matched": at the detections matched to ground-truth persons by the fairness matching protocol (SPEC §6),
    labelled with the matched person's group; when fewer than `min_matched` persons are matched (a weak model), or
    boxes="ground_truth", at every ground-truth person box instead. Classification clients give their penultimate
    features per sample. Returns features (n, d), groups (n,), n_matched, and source ("matched", "ground_truth" or
    "penultimate").
    """
    if not is_detection_client(client):  # classification: the penultimate features the GRL adversary sees
        pred = classification_outputs(client, loader, fabric)
        known = pred.groups >= 0
        return {"features": pred.features[known].numpy(), "groups": pred.groups[known].numpy(), "n_matched": 0,
                "source": "penultimate"}
    from resfl_lightning.data.detection import ground_truth_for
    from resfl_lightning.losses.adversary import roi_pool_features
    from resfl_lightning.metrics.matching import match_pred_gt

    model = client.model
    strides = [int(s) for s in model.strides.tolist()]
    matched_f, matched_g, gt_f, gt_g = [], [], [], []
    with eval_mode(client):
        for batch in loader:
            batch = _to_device(fabric, batch)
            out = model(batch["img"])
            gt_f.append(client.person_features(out["feats"], batch).float().cpu())
            gt_g.append(batch["groups"].long().cpu())
            if boxes != "matched":
                continue
            iou = client.ufm.iou_threshold
            preds = model.predict(out, conf=score_threshold, iou=iou, max_det=client.max_det)
            rois, owner, groups = [], [], []
            for i, (pred, gt) in enumerate(zip(preds, ground_truth_for(batch))):
                pred = {k: v.cpu() for k, v in pred.items()}
                gt = {k: v.cpu() for k, v in gt.items()}
                pred_to_gt, _ = match_pred_gt(pred, gt, iou, score_threshold)
                hit = torch.nonzero(pred_to_gt >= 0).flatten()
                g = gt["groups"][pred_to_gt[hit]]
                known = g >= 0
                rois.append(pred["boxes"][hit[known]])
                groups.append(g[known])
                owner.append(torch.full((int(known.sum()),), i, dtype=torch.long))
            if sum(len(r) for r in rois):
                matched_f.append(roi_pool_features(out["feats"], strides, torch.cat(rois), torch.cat(owner))
                                 .float().cpu())
                matched_g.append(torch.cat(groups).long())
    n_matched = int(sum(len(g) for g in matched_g))
    if boxes == "matched" and n_matched >= min_matched:
        feats, groups, source = torch.cat(matched_f), torch.cat(matched_g), "matched"
    else:
        feats, groups, source = torch.cat(gt_f), torch.cat(gt_g), "ground_truth"
    known = groups >= 0
    return {"features": feats[known].numpy(), "groups": groups[known].numpy(), "n_matched": n_matched,
            "source": source}


# --- update-aware AIA ---------------------------------------------------------------------------------------------
def default_head_prefixes(client: Any) -> list[str]:
    """State-dict prefixes of the detection head (Detect module + NIG branch), else of the model's last layer (the
    adversary, registered after the model, is not the head)."""
    model = getattr(client, "model", None)
    if model is not None and hasattr(model, "detector") and hasattr(model, "nig"):
        return [f"model.detector.model.{len(model.detector.model) - 1}.", "model.nig."]
    module, prefix = (model, "model.") if model is not None else (client, "")
    names = [prefix + n for n, _ in module.named_parameters()]
    if not names:
        raise ValueError(f"{type(client).__name__} has no parameters")
    return [names[-1].rsplit(".", 1)[0] + "."]


# --- Byzantine ----------------------------------------------------------------------------------------------------
def parameter_mask(client: torch.nn.Module, layout: Any) -> torch.Tensor:
    """Bool mask over the flat update: True on trainable parameters, False on float buffers (BN running stats)."""
    params = {n for n, _ in client.named_parameters()}
    return torch.cat([torch.full((int(shape.numel()),), key in params, dtype=torch.bool)
                      for key, shape in zip(layout.float_keys, layout.shapes)])


class ByzantineUpdate:
    """Update transform (client_id, round_idx, delta) -> delta: the round's attackers send -gamma * delta, optionally
    rescaled to an l2 bound; attackers are drawn per round from (seed, round) (byzantine.choose_attackers)."""

    def __init__(self, num_clients: int, settings: ByzantineSettings, seed: int, mask: torch.Tensor | None = None):
        self.num_clients, self.settings, self.seed, self.mask = num_clients, settings, seed, mask

    def attackers(self, round_idx: int) -> list[int]:
        return choose_attackers(self.num_clients, self.settings.fraction, self.seed, round_idx)

    def __call__(self, client_id: int, round_idx: int, delta: torch.Tensor) -> torch.Tensor:
        if client_id not in self.attackers(round_idx):
            return delta
        s = self.settings
        if self.mask is None:
            return byzantine_transform(delta, s.gamma, s.l2_bound)
        mask = self.mask.to(delta.device)
        if mask.numel() != delta.numel():
            raise ValueError(f"Byzantine mask has {mask.numel()} entries, the update {delta.numel()}")
        out = delta.clone()
        out[mask] = byzantine_transform(delta[mask], s.gamma, s.l2_bound)
        return out


# --- data poisoning ----------------------------------------------------------------------------------------------
@dataclass
class _AnnotatedView:
    """The same images as `source` with replaced annotations (the poisoned client's view)."""

    source: Any
    annotations: Any

    def __len__(self) -> int:
        return len(self.source)

    def load_image(self, i: int) -> np.ndarray:
        return self.source.load_image(i)


class PoisonedData:
    """Federated data whose poisoned clients train on poisoned annotations inside the poisoning block.

    Everything else (validation, test, reserve, other clients, rounds outside the block) is the wrapped data. The
    block counts rounds: [start_round, start_round + length) -- i.e. length x local_epochs local epochs. The poisoned
    client set is fixed for the run (poisoning.poisoned_clients). A callback sets `round_idx` at each round start.
    """

    def __init__(self, base: Any, settings: PoisoningSettings, seed: int, rounds: int):
        self.base, self.settings, self.seed = base, settings, seed
        self.length = rounds if settings.length is None else settings.length
        self.clients = poisoned_clients(base.num_clients, settings.fraction, seed)
        self.round_idx = 0
        self._views: dict[int, tuple[Any, dict]] = {}
        s = settings
        if not 0 <= s.target_group < base.num_groups:
            raise ConfigError(f"attack.poisoning.target_group must lie in 0..{base.num_groups - 1}, "
                              f"got {s.target_group}")
        self.detection = hasattr(base, "source") and hasattr(base.source, "annotations")
        if not (dataclasses.is_dataclass(base) and (self.detection or hasattr(base, "y"))):
            raise NotImplementedError(f"data poisoning for {type(base).__name__}: supported for detection data "
                                      "(annotations) and tabular data (x, y, groups)")
        lowest = 1 if self.detection else 0  # detection: class 0 is the person class being skewed
        if s.mode == "mislabel" and not (s.mislabel_class is not None
                                         and lowest <= s.mislabel_class < base.num_classes):
            raise ConfigError(f"attack.poisoning.mode=mislabel needs mislabel_class in {lowest}.."
                              f"{base.num_classes - 1}; this dataset has {base.num_classes} class(es)"
                              + (" (use mode=drop or relabel_group)" if base.num_classes <= lowest else ""))
        if s.mode == "relabel_group" and not (s.other_group is not None and 0 <= s.other_group < base.num_groups
                                              and s.other_group != s.target_group):
            raise ConfigError(f"attack.poisoning.mode=relabel_group needs other_group in 0..{base.num_groups - 1}, "
                              f"different from target_group {s.target_group}")

    def __getattr__(self, name: str) -> Any:
        if name == "base":  # not set yet (e.g. during unpickling): avoid infinite recursion
            raise AttributeError(name)
        return getattr(self.base, name)

    def set_round(self, round_idx: int) -> None:
        self.round_idx = int(round_idx)

    def active(self, client_id: int) -> bool:
        s = self.settings
        return client_id in self.clients and is_poison_round(self.round_idx, s.start_round, self.length)

    def poisoned(self, client_id: int) -> tuple[Any, dict]:
        """(data view with the client's poisoned training annotations, poisoning summary); cached per client."""
        if client_id not in self._views:
            self._views[client_id] = (self._detection_view if self.detection else self._tabular_view)(client_id)
        return self._views[client_id]

    def _poison(self, arrays: dict[str, np.ndarray], client_id: int, person_class: int) -> tuple[dict, dict]:
        s = self.settings
        return poison_annotations(arrays, s.target_group, s.mode, s.rate,
                                  seed=stream_seed(self.seed, _POISON_SEED_STREAM, client_id),
                                  other_group=s.other_group, mislabel_class=s.mislabel_class,
                                  person_class=person_class)

    def _detection_view(self, client_id: int) -> tuple[Any, dict]:
        """The client's training images keep their pixels; their annotation rows are replaced."""
        base = self.base
        ann = base.source.annotations
        rows = np.isin(ann.image_index, base.splits.clients[client_id].train)
        sub = ann.select(rows)
        arrays = {"image_index": sub.image_index, "cls": sub.cls, "boxes": sub.boxes, "groups": sub.groups,
                  "proxy": sub.proxy, **{f"extra/{k}": v for k, v in sub.extra.items()}}
        new, summary = self._poison(arrays, client_id, person_class=0)
        rest = ann.select(~rows)
        extra = {k: np.concatenate([rest.extra[k], new[f"extra/{k}"]]) for k in rest.extra}
        merged = type(ann)(np.concatenate([rest.image_index, new["image_index"]]),
                           np.concatenate([rest.cls, new["cls"]]), np.concatenate([rest.boxes, new["boxes"]]),
                           np.concatenate([rest.groups, new["groups"]]), np.concatenate([rest.proxy, new["proxy"]]),
                           extra)
        return dataclasses.replace(base, source=_AnnotatedView(base.source, merged)), summary

    def _tabular_view(self, client_id: int) -> tuple[Any, dict]:
        """One row per sample: drop removes the rows from the client's training split, mislabel sets their label to
        mislabel_class, relabel_group their group to other_group."""
        base = self.base
        train = np.asarray(base.splits.clients[client_id].train, np.int64)
        y, groups = base.y.clone(), base.groups.clone()
        arrays = {"image_index": train, "cls": y[train].numpy(), "boxes": np.zeros((len(train), 4), np.float32),
                  "groups": groups[train].numpy()}
        new, summary = self._poison(arrays, client_id, person_class=-1)  # every class id is a valid target
        if self.settings.mode == "drop":
            clients = list(base.splits.clients)
            clients[client_id] = dataclasses.replace(clients[client_id], train=new["image_index"])
            return dataclasses.replace(base, splits=dataclasses.replace(base.splits, clients=clients)), summary
        y[train] = torch.as_tensor(new["cls"], dtype=y.dtype)
        groups[train] = torch.as_tensor(new["groups"], dtype=groups.dtype)
        return dataclasses.replace(base, y=y, groups=groups), summary

    def train_loader(self, client_id: int, seed: int):
        if not self.active(client_id):
            return self.base.train_loader(client_id, seed)
        return self.poisoned(client_id)[0].train_loader(client_id, seed)
