"""Pure federated-learning math: typed messages and state, state-dict arithmetic,
the `Strategy` and `ClientObjective` bases, registries. Never imports Ray or W&B."""
