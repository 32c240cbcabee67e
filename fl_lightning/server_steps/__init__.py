"""Reusable server-side procedures, called from `Strategy.server_update` on the driver.

`prototypes`: aggregation of per-class means, FedTGP's trainable global prototypes.
`prompt_tuning`: FedTSP's class-specific soft prompts through a frozen text encoder.

Plain PyTorch: no Ray, no W&B, no Lightning; state goes in and comes out as tensors, so
the method's `ServerState` (and hence a checkpoint) holds everything that survives rounds.
"""
