"""Every stable message code, with the one line it means.

A message code names a condition, not a wording: scripts, dashboards and the docs key on it, so a
code never changes meaning once published, and messages may be reworded freely. Codes are
dotted, lowercase, and start with the part of the product that reports them:

* ``config.`` — a config file problem found while loading (YAML, schema, ranges, secrets);
* ``engine.`` — a config problem in routing terms (aliases, groups, routes, rules);
* ``control.`` — an answer of the control plane;
* ``gw.`` — an answer of the gateway to a client request, or an attempt's outcome.

This table is the registry. docs/codes.md lists the same codes with the same meanings, and a test
fails when the two disagree or when a code-shaped string literal anywhere in the source is not
registered here.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = ("CODES", "PREFIXES", "meaning")

PREFIXES = ("config.", "engine.", "control.", "gw.")

_CODES = {
    # --- config: loading, schema and ranges -----------------------------------------------
    "config.yaml_invalid": "The config file is not valid YAML, or its top level is not a mapping.",
    "config.yaml_alias": "The config uses a YAML anchor or alias (`&name`, `*name`); none is read.",
    "config.yaml_too_deep": "The config nests collections deeper than 32 levels.",
    "config.wrong_type": "A field holds the wrong kind of value (text where a number belongs…).",
    "config.missing_field": "A required field is absent.",
    "config.unknown_field": "A field the schema does not know, often a misspelling.",
    "config.out_of_range": "A number lies outside its allowed range.",
    "config.invalid_choice": "A field holds a value outside its fixed set of choices.",
    "config.name_invalid": "A name is blank, has surrounding spaces, or is the reserved `__all__`.",
    "config.name_unprintable": (
        "A name or model name holds a control, format or separator character (U+2028…)."
    ),
    "config.version_unsupported": "`version` is not 1.",
    "config.template_invalid": "A `${VAR}` template is malformed (unclosed brace, bad name).",
    "config.env_missing": "A `${VAR}` template names an environment variable that is not set.",
    "config.url_invalid": "A URL or DSN is malformed or has the wrong scheme.",
    "config.bind_invalid": "A listener's bind address is not an IP address or host name.",
    "config.port_conflict": "The gateway and control listeners share an address and port.",
    "config.cidr_invalid": "An allow_from entry is not an IP address or network.",
    "config.origin_invalid": "An allow_origins entry is not a web origin (scheme://host[:port]).",
    "config.host_invalid": "An allow_hosts entry is not a host name or IP address.",
    "config.control_key_missing": "The control plane is enabled but has no key.",
    "config.key_empty": "A gateway, upstream or control key is empty.",
    "config.client_duplicate_name": "Two gateway keys have the same name.",
    "config.time_invalid": (
        "A time (expires_at, previous_key_until) is not unix seconds or ISO 8601."
    ),
    "config.previous_key_until_missing": "A key's previous_key has no previous_key_until.",
    "config.client_duplicate_key": "Two gateway keys have the same key.",
    "config.client_key_is_control_key": "A gateway key is the same as the control key.",
    "config.key_concurrency_range": "clients[].max_concurrent is outside 1–1000.",
    "config.key_limit_two_measures": "A key limit names more than one of requests, tokens, cost.",
    "config.key_limit_no_measure": "A key limit names none of requests, tokens, cost.",
    "config.key_limit_duplicate": "A key has two limits with the same window and measure.",
    "config.key_limit_cache_reads": "cache_reads is set on a requests or cost limit (tokens only).",
    "config.key_limit_retention": (
        "A day, week or month key limit needs retention.row_days of at least 1, 7 or 31."
    ),
    "config.default_key_unknown": "default_key names no gateway key.",
    "config.provider_duplicate_name": "Two upstreams have the same name.",
    "config.provider_concurrency_range": "providers[].max_concurrent is outside 1–1000.",
    "config.responses_transport_protocol": (
        "responses_transport: websocket on an upstream whose protocol is not openai-responses."
    ),
    "config.aws_field_protocol": (
        "region, count_tokens or an aws_* field on an upstream whose protocol is not "
        "bedrock-anthropic or bedrock-converse."
    ),
    "config.cloud_field_protocol": (
        "A Vertex AI field (project, location, credentials_file) or an Azure OpenAI field "
        "(api_version, deployments, api, auth) on an upstream of another protocol."
    ),
    "config.header_invalid": (
        "An upstream header has a bad name or value, is repeated, or is one the gateway sets."
    ),
    "config.provider_models_empty": "An upstream's models list is empty (omit it to offer any).",
    "config.provider_model_duplicate": "An upstream's models list names a model twice.",
    "config.model_name_invalid": "A model name is blank or holds a wildcard where one is needed.",
    "config.model_spec_blank": "A model_specs entry has a blank model name.",
    "config.model_spec_wildcard": "A model_specs entry names a wildcard instead of one model.",
    "config.model_spec_zero": "A model_specs figure is zero or negative.",
    "config.model_spec_empty": "A model_specs entry sets neither figure.",
    "config.model_spec_output_exceeds_window": (
        "A model_specs entry's max_output_tokens is larger than its context_window."
    ),
    "config.price_sheet_duplicate": "Two price sheets have the same name.",
    "config.price_sheet_unknown": "An upstream's price_sheet names no sheet in pricing.sheets.",
    "config.failover_pause_order": "failover.max_pause_secs is below failover.pause_secs.",
    "config.listen_limits_conflict": (
        "Two transport limits under listen disagree (a body budget below one body, a hard "
        "header cap below the advertised one, listen.control.max_config_bytes above "
        "listen.control.max_body_bytes)."
    ),
    "config.slow_start_too_short": (
        "failover.stream_start_wait_secs is under 5 while next_on_slow_start is on."
    ),
    "config.not_built": "A field whose behaviour is not built yet; refused rather than ignored.",
    "config.secret_invalid": (
        "A key or header value cannot be sent in an HTTP header once its variables are read "
        "(line break, control character, white space at an end, empty)."
    ),
    "config.notify_duplicate_name": "Two notifications entries have the same name.",
    "config.notify_secret_short": (
        "A notifications secret has fewer than 16 characters once its variables are read."
    ),
    "config.notify_events_empty": "A notifications entry's events list is empty.",
    # --- engine: aliases, groups, routes, rules ------------------------------------------
    "engine.name_taken": "A group has the name of an upstream, so `to:` could not tell them apart.",
    "engine.alias_empty": "An alias lists no model.",
    "engine.alias_to_alias": "An alias points at another alias.",
    "engine.group_duplicate_name": "Two groups have the same name.",
    "engine.group_empty": "A group lists no upstream.",
    "engine.group_upstream_twice": "A group lists the same upstream twice.",
    "engine.group_unknown_upstream": "A group lists a name that is not an upstream.",
    "engine.group_weight_out_of_range": "A group member's weight is outside 1–100.",
    "engine.group_weight_not_load_balance": (
        "A member weight is given in a group that is not load-balance."
    ),
    "engine.group_selected_not_select": "`selected` is given in a group that is not select.",
    "engine.group_selected_unknown": "A select group's `selected` is not one of its members.",
    "engine.group_balance_by_not_load_balance": (
        "`balance_by` is given in a group that is not load-balance."
    ),
    "engine.route_duplicate_name": "Two routes have the same name.",
    "engine.rule_duplicate_name": "Two rules of one route have the same name.",
    "engine.rule_no_action": "A rule has none of to, deny and set.",
    "engine.rule_to_and_deny": "A rule has both to and deny.",
    "engine.rule_continue_with_target": "A rule with to or deny says on_match: continue.",
    "engine.rule_unknown_target": "A rule's `to` names no upstream or group.",
    "engine.rule_unknown_client": "A rule's when.client names no gateway key.",
    "engine.rule_comparison_invalid": (
        "A token or tool-count condition is not a comparison such as '>200k'."
    ),
    "engine.rule_hop_only_set": "A provider_would_be rule has to or deny; it may only set.",
    "engine.rule_hop_needs_continue": "A provider_would_be rule lacks on_match: continue.",
    "engine.rule_hop_unknown_upstream": "A rule's when.provider_would_be names no upstream.",
    "engine.pinned_unknown_upstream": "A pinned target names no upstream.",
    "engine.pinned_model_not_offered": "A pinned target's upstream does not offer its model.",
    "engine.client_route_unknown": "A gateway key's route names no route.",
    "engine.default_route_unknown": "default_route names no route.",
    "engine.pinned_upstream_twice": "A pinned `to:` names the same upstream twice.",
    # --- config: live reload (stage 4) ----------------------------------------------------
    "config.runtime_failed": "The runtime objects (router, slots, keys) did not build from it.",
    "config.listen_unavailable": "A changed listen address cannot be bound; the old one stays.",
    # --- control plane -------------------------------------------------------------------
    "control.auth.missing_key": "A control-plane request carries no control key (401).",
    "control.auth.bad_key": "The control key is wrong (401).",
    "control.request.not_found": "No control-plane view at this path (404).",
    "control.request.method_not_allowed": "The control-plane path exists, not for this method.",
    "control.request.bad_json": "A control-plane request body is not valid JSON (400).",
    "control.request.cross_origin": (
        "A control-plane write sent by a page of another origin is refused (403)."
    ),
    "control.request.invalid": "A control-plane request lacks a field or has a wrong one (400).",
    "control.config.stale_version": (
        "A config write was based on an older version than the current one (409)."
    ),
    "control.config.rejected": "A config write was refused; its problems are listed (422).",
    "control.config.too_large": "A PUT /config is over listen.control.max_config_bytes (413).",
    "control.provider_unknown": "The control-plane request names no upstream (404).",
    "control.model_spec_invalid": "A model spec written through the control plane is refused.",
    "control.safe_mode": "The config failed to load; only the control plane is serving.",
    "control.group_unknown": "The control-plane request names no group (404).",
    "control.store_unavailable": "The request store's database cannot be read now (503).",
    "control.key_unknown": "The control-plane request names no gateway key (404).",
    "control.key_exists": "A key created through the control plane has a name in use (409).",
    "control.key_invalid": "A key write through the control plane has a wrong field (400).",
    "control.key_from_env": "The key is read from a ${VAR}; rotate it where that is set (409).",
    "control.config.layout": (
        "A small write cannot be spliced into how this part of the file is written (409)."
    ),
    "control.abort.unknown_request": "No request of that id runs or ran on this instance (404).",
    "control.abort.finished": "The request to abort has finished, or is ending (409).",
    # --- gateway answers and attempt outcomes --------------------------------------------
    "gw.auth.missing_key": "The request carries no gateway key (401).",
    "gw.auth.bad_key": "The gateway key is not one the config lists (401).",
    "gw.auth.key_expired": "The gateway key's expires_at has passed (401).",
    "gw.auth.denied_address": "The client's address is outside listen.gateway.allow_from (403).",
    "gw.request.not_found": "No API or model at this path (404).",
    "gw.request.method_not_allowed": "The path exists, but not for this HTTP method (405).",
    "gw.request.bad_json": "The body is not valid JSON or lacks what the API requires (400).",
    "gw.request.body_too_large": "The request body is over the size limit (413).",
    "gw.request.headers_too_large": "The request headers are over the size limit (431).",
    "gw.request.bad_http": "The request is not well-formed HTTP (400).",
    "gw.request.timeout": "The client was too slow sending its request (408).",
    "gw.request.bodies_busy": (
        "Request bodies held in memory are at the gateway's limit; retry shortly (503)."
    ),
    "gw.store.unavailable": (
        "PostgreSQL (store.postgres_dsn) stopped answering; rows are kept, written on its return."
    ),
    "gw.store.recovered": (
        "PostgreSQL (store.postgres_dsn) answers again; the rows kept were written."
    ),
    "gw.store.row_set_aside": (
        "A request row could not be written (a value the database refuses); it is kept as "
        "JSON in the `rejected` table and the writer goes on "
        "(log, `gateway_store_rows_set_aside_total`)."
    ),
    "gw.store.commit_late": (
        "An answer's end waited store.commit_wait_secs for its row's commit and went anyway (log)."
    ),
    "gw.request.foreign_origin": (
        "A web page (Origin, Sec-Fetch-Site) outside listen.gateway.allow_origins sent it (403)."
    ),
    "gw.request.unexpected_host": "The Host is not one listen.gateway.allow_hosts names (403).",
    "gw.request.unsupported_media_type": "A POST body's Content-Type is not JSON (415).",
    "gw.overloaded": (
        "The gateway sheds load: listen.gateway.max_requests in progress, or its event loop "
        "behind by listen.gateway.shed_loop_lag_ms; or it ran short of its own upstream "
        "connections (pool.max_connections) or file descriptors before the upstream was reached "
        "(503, Retry-After, x-thinkwatch-error: rate_limited)."
    ),
    "gw.workers.no_shared_state": (
        "`serve --workers` with more than one worker and no state.redis_url (exit status 2)."
    ),
    "gw.listen.address_busy": (
        "The client's address holds listen.gateway.max_connections_per_address already (503)."
    ),
    "gw.listen.idle_closed": (
        "At the connection caps, an idle connection (HTTP/1.1 between requests, HTTP/2 "
        "without a stream, a Responses WebSocket without a turn) closed for a new client (log)."
    ),
    "gw.listen.fd_exhausted": (
        "Accepting failed for want of file descriptors; the gateway backs off, retries (log)."
    ),
    "gw.listen.door_failed": (
        "The door's thread (new clients refused while the event loop is behind) could not "
        "answer a client, or stopped; the event loop still accepts every client (log)."
    ),
    "gw.listen.cannot_bind": (
        "Cannot listen on listen.*.bind and port: in use, not local, or not permitted."
    ),
    "gw.listen.bind_unresolved": (
        "listen.*.bind is neither an IP address nor a host name that resolves."
    ),
    "gw.request.invalid_body": (
        "A field of the body has the wrong shape for its API (messages not a list…) (400)."
    ),
    "gw.request.model_name_too_long": (
        "The model name asked for is longer than listen.gateway.max_model_name_chars (400)."
    ),
    "gw.no_upstream": "No upstream can take the request: every candidate was skipped.",
    "gw.count_tokens.refused": (
        "A token count whose upstream is a Bedrock provider with `count_tokens: refuse` (501)."
    ),
    "gw.upstream.connect": "The upstream could not be reached (refused, reset, TLS failure).",
    "gw.upstream.error": "The upstream answered with an error.",
    "gw.upstream.timeout": "The upstream did not answer in time (504).",
    "gw.upstream.idle_timeout": "The upstream was silent longer than failover.idle_timeout_secs.",
    "gw.upstream.stream_ended_early": "The upstream's stream broke or ended before any content.",
    "gw.upstream.stream_opening_error": (
        "The upstream's stream opened with an error event before any content."
    ),
    "gw.upstream.stream_error": (
        "The upstream sent an error event inside its stream; the client gets it in its format."
    ),
    "gw.upstream.broken_after_content": (
        "The upstream's stream broke after content reached the client; it ends with an error."
    ),
    "gw.upstream.answer_too_large": (
        "An event of the upstream's stream is over its provider's max_answer_bytes (default "
        "64 MiB); the answer ends with this error after what reached the client."
    ),
    "gw.upstream.eventstream_corrupt": (
        "An upstream's event stream has a bad checksum, an impossible length or an unreadable "
        "header; the stream is dropped."
    ),
    "gw.upstream.eventstream_too_large": (
        "An upstream's event-stream message is over the decoder's bound (1 MiB), or its headers "
        "over 128 KiB."
    ),
    "gw.upstream.eventstream_truncated": "An upstream's event stream ended inside a message.",
    "gw.upstream.credentials_missing": (
        "An upstream's key or header needs an environment variable that is not set; "
        "that upstream is skipped."
    ),
    "gw.upstream.credentials_invalid": (
        "An upstream's key or header cannot be sent in a header; that upstream is skipped."
    ),
    "gw.upstream.token_unavailable": (
        "A Vertex AI upstream's access token could not be obtained (google-auth missing, the "
        "key file unreadable, the token endpoint refusing); that upstream is skipped."
    ),
    "gw.upstream.auth_rejected": (
        "An upstream refused the gateway's credentials (401/403); the client gets the "
        "gateway's message, not the upstream's."
    ),
    "gw.busy_all": "Every candidate upstream stayed full for failover.wait_secs (429).",
    "gw.busy_upstream": (
        "The upstream the request was held to stayed full for failover.wait_secs (429)."
    ),
    "gw.slow_start": (
        "An attempt was dropped for a faster start elsewhere (next_on_slow_start); not a failure."
    ),
    "gw.rule.denied": "A routing rule with deny refused the request (403).",
    "gw.key_limit.tokens_rolling": "The key's per-minute or per-hour token limit is used up (429).",
    "gw.key_limit.requests_rolling": (
        "The key's per-minute or per-hour request limit is used up (429)."
    ),
    "gw.key_limit.cost_rolling": "The key's per-minute or per-hour cost limit is used up (429).",
    "gw.key_limit.period": "A day, week or month limit of the key is used up until reset (429).",
    "gw.key.busy": "The key's max_concurrent stayed full for failover.wait_secs (429).",
    "gw.key.model_not_allowed": "The model is not one the key's allowed_models matches (403).",
    "gw.request.aborted": (
        "The operator aborted the request from the control plane; not the upstream's fault (503)."
    ),
    "gw.responses.previous_not_found": (
        "previous_response_id names no response this key stored that has not expired (400)."
    ),
    "gw.ws.upstream_closed": "The upstream closed the WebSocket during a turn; that turn failed.",
    "gw.ws.bad_event": "A WebSocket message is not JSON, or not a client event taken there (400).",
    "gw.ws.busy": "Too many turns already wait on this WebSocket; this one was not queued (429).",
    "gw.ws.closing": "The gateway drains; a turn queued on the WebSocket was not started (503).",
    "gw.ws.too_many_sockets": (
        "The key has max_sockets_per_key Responses WebSockets open; the upgrade is refused (429)."
    ),
    "gw.ws.ping_flood": (
        "A WebSocket peer owed more pongs than max_owed_pongs while not reading; dropped (log)."
    ),
    "gw.ws.stopped_reading": (
        "A WebSocket peer read nothing for write_timeout; taken as gone and dropped (log)."
    ),
    "gw.http2.control_flood": (
        "An HTTP/2 client owed more PING/SETTINGS acks than max_owed_control_frames; dropped (log)."
    ),
    "gw.http2.stalled": (
        "An HTTP/2 answer waited max_blocked_secs in all for its window; stream reset (log)."
    ),
    "gw.realtime.no_upstream": (
        "No usable Realtime upstream (`realtime: true`) serves the model (404)."
    ),
    "gw.realtime.model_required": "A Realtime upgrade without `?model=` (400).",
    "gw.realtime.busy": "Every Realtime upstream for the model is at its `max_concurrent` (429).",
    "gw.realtime.upstream_too_big": (
        "A Realtime upstream sent a message over the size limit; both sides were closed 1009."
    ),
    "gw.realtime.upstream_failed": (
        "No Realtime upstream for the model accepted the WebSocket (502)."
    ),
    "gw.not_supported": "The request asks for something the gateway does not support.",
    "gw.all_failed": "Every candidate upstream failed; the message lists what was tried.",
    "gw.internal": "An unexpected fault inside the gateway (500).",
    # --- gw: state shared across instances (events, not answers) ----------------------------
    "gw.shared_state.lost": (
        "Redis (`state.redis_url`) failed or is unreachable: this instance counts alone."
    ),
    "gw.shared_state.back": "Redis answers again: limits, slots, pauses and affinity are shared.",
}

CODES: Mapping[str, str] = MappingProxyType(_CODES)


def meaning(code: str) -> str:
    """The registered meaning of `code`; KeyError for a code that is not registered."""
    return CODES[code]
