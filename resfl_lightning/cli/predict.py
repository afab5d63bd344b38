"""`resfl predict MODEL IMAGE [IMAGE ...]`: an exported model's detections with the evidence behind each box
(resfl_lightning/models/predict.py): per image and box xyxy (pixels), score = E[p_c], label and its name, alpha0
(total Dirichlet evidence), vacuity = (C + 1) / alpha0 and u_box. Prints JSON (or writes it with --out)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="resfl predict", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", type=Path, help="an export, e.g. runs/<run>/export/global.pt")
    p.add_argument("images", nargs="+", type=Path, help="image files")
    p.add_argument("--conf", type=float, default=0.25, help="score threshold (YOLO.predict's default)")
    p.add_argument("--iou", type=float, default=0.7, help="NMS IoU threshold (YOLO.predict's default)")
    p.add_argument("--max-det", type=int, default=300)
    p.add_argument("--imgsz", type=int, default=None, help="letterbox size (default: the model's training size)")
    p.add_argument("--out", type=Path, default=None, help="write the JSON here instead of printing it")
    args = p.parse_args(argv)
    from resfl_lightning.models.predict import predict

    try:
        dets = predict(args.model, [str(i) for i in args.images], conf=args.conf, iou=args.iou, max_det=args.max_det,
                       imgsz=args.imgsz)
    except (ValueError, FileNotFoundError) as err:
        print(f"predict error: {err}", file=sys.stderr)
        return 2
    text = json.dumps([{"image": str(i), "detections": d.records()} for i, d in zip(args.images, dets)], indent=1)
    if args.out is None:
        print(text)
    else:
        args.out.write_text(text + "\n")
        print(f"wrote {args.out}")
    return 0
