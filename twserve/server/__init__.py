"""The client's side of the wire: anyio sockets driving h11, h2 and wsproto."""
