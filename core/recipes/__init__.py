"""Training recipes: stage 1 (attention transfer) and stage 2 (LoRA), sharing one step loop."""
