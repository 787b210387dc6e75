"""Framework integrations: trainspeed telemetry inside loops you keep.

- `trainspeed.integrations.lightning.TrainspeedCallback` (PyTorch Lightning; extra `lightning`)
- `trainspeed.integrations.hf.TrainspeedCallback` (Hugging Face Trainer; extra `hf`)

Import the submodule you need: each imports its framework on import, this package imports neither.
"""
