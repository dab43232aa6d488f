"""One process: the wiring, and what runs beside the requests."""
