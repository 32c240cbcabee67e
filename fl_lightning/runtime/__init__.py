"""Where clients run: the client host, serial and Ray executors, the round loop, checkpoints."""
