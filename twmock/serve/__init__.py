"""The mock's IO, and the only place in twmock that does any: `handler` (the per-instance
counters, random draws, clock and request log, and `carry_out`, which plays a plan over a twserve
`Responder`), `server` (the HTTP/1.1 and h2c server around it), the two WebSocket endpoints
`realtime` and `responses_socket` with `upgrade` (refusing an upgrade), and `cli` (command-line
options, script files and ``python -m twmock``)."""
