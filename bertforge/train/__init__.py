"""The one training loop (pretraining and fine-tuning share it), its optimiser, checkpoints and DDP."""
