"""The control plane: its HTTP API, config writes and metrics."""
