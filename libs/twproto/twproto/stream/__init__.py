"""A streamed answer, in the order its bytes pass through twproto (docs/streams.md).

1. `hold` — which events are content, and the opening hold that keeps a stream back until the
   first of them (`OpeningHold`).
2. `upstream` — an upstream's stream from its first byte: held, then handed over to its
   translator without decoding anything twice (`UpstreamStream`).
3. `translators` — the three ways a stream reaches the client: relayed and watched, converted,
   or collected into a whole answer (`new_stream_translator`).
4. `resume` — a stream that broke off, continued on another upstream and spliced into the same
   client answer (`ResumableStream`).

A folder, not a facade: every public name is exported by ``twproto`` itself.
"""

__all__ = ()
