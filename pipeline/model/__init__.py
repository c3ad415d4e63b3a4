"""The model: the frozen ViLT (`backbone`, `vision`), the prompt module
(`prompts`), the network with its head (`network`), its loss, training steps
and checkpoints, and the embedding of a dataset's samples."""
