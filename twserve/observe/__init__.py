"""What the gateway tells its operator beyond the control plane: structured logs and the
request ids that tie a client's answer to its row (docs/observability.md)."""

__all__ = ()
