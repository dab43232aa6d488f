"""The mock's answer writers, one per API format: each turns a format-independent `Answer`
(twmock.answer) into that provider's whole body, stream events and error bodies, byte for byte
as the provider writes them. Pure: no IO, clock or randomness (the ids come from the request's
seed). `_wire` holds the JSON layouts and SSE framing the writers share.
"""
