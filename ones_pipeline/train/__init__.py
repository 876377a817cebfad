"""Training step: elastic, resumable data-parallel PyTorch training (models, data, sampler, checkpoints)."""
