"""Training: the shared step loop, stage 1 (attention transfer), stage 2 (LoRA), checkpoints."""
