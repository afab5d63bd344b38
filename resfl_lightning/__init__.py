"""resfl-lightning: RESFL + CurvFed federated learning simulator on PyTorch Lightning Fabric."""

# Runs first on any `resfl_lightning.*` import: ultralytics must see YOLO_OFFLINE / YOLO_CONFIG_DIR before it loads.
from resfl_lightning import env as _env  # noqa: F401

__version__ = "0.1.0"
