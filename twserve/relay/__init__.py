"""One request carried to its upstreams: the attempt ledger's verb loop."""
