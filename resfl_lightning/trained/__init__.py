"""What is done with a finished run's global model: load it into a fresh client (load.py), export it for ultralytics
(export.py; the conversion itself is models/export.py) and fine-tune it under the weather protocol (finetune.py)."""
