"""The operator console: the management API behind it and its page (docs/console.md)."""
