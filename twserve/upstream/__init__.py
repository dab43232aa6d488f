"""The network side of an attempt: pools, connections, sockets."""
