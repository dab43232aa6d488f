"""Stage 2 for the ``providers`` section: each upstream read with its URL, headers, model list
and model specs.

A check that needs only the upstream's own fields is made here (a URL's scheme and host, a
header the gateway sets itself, a spec's limits); whether its key and headers can be read from
the environment, and whether its price sheet exists, is stage 3's
(`twengine.config.stages.consistency`). Each upstream is returned as a `_Placed`, its value
with the path it was read at.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from twengine.config import defaults
from twengine.config.model import (
    BedrockCount,
    BedrockSettings,
    Billing,
    ModelSpec,
    Provider,
    ResponsesTransport,
)
from twengine.config.schema import SECTIONS
from twengine.config.stages.cloud import _cloud
from twengine.config.stages.fields import (
    _ABSENT,
    _WILDCARD,
    _as_model,
    _as_number,
    _as_secret,
    _as_text,
    _at,
    _entries,
    _Fields,
    _Placed,
    _printable,
    _Problems,
)
from twengine.config.template import TemplateError, template_variables
from twproto.dialect import Dialect

BEDROCK_ANTHROPIC = "bedrock-anthropic"
BEDROCK_CONVERSE = "bedrock-converse"

__all__ = ()

_HTTP_URL = re.compile(
    r"(?P<scheme>https?)://(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(?::(?P<port>\d{1,5}))?"
    r"(?P<path>/[^\s?#]*)?"
)


def _http_url(out: _Problems, path: str, value: object) -> tuple[str, str] | None:
    """(URL without trailing slash, lowercased host) of an http(s) base URL."""
    text = _as_text(out, path, value)
    if text is None:
        return None
    m = _HTTP_URL.fullmatch(text.strip())
    if m is None or (m["port"] and not 1 <= int(m["port"]) <= 65535):
        # A URL with an ``@`` may carry a user and password: describe it without quoting it.
        shown = "the value" if "@" in text else repr(text)
        out.add(
            "config.url_invalid",
            path,
            f"{shown} is not an http:// or https:// base URL (no query, no fragment, no user)",
        )
        return None
    return text.strip().rstrip("/"), m["host"].lower()


# RFC 9110 token characters for header names.
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# Framing and connection headers are the gateway's own: a fixed value would corrupt requests.
_GATEWAY_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
    }
)


def _headers(out: _Problems, f: _Fields) -> tuple[tuple[str, str], ...]:
    mapping = f.mapping("headers")
    if mapping is None:
        return ()
    result: list[tuple[str, str]] = []
    seen: set[str] = set()
    for name, value in mapping.items():
        path = _at(f.at("headers"), str(name))
        if not isinstance(name, str) or not _HEADER_NAME.fullmatch(name):
            out.add("config.header_invalid", path, f"{name!r} is not a valid header name")
            continue
        lowered = name.lower()
        if lowered in _GATEWAY_HEADERS:
            out.add("config.header_invalid", path, f"{name} is set by the gateway itself")
            continue
        if lowered in seen:
            out.add("config.header_invalid", path, f"header {name} is given twice")
            continue
        seen.add(lowered)
        text = _as_text(out, path, value)
        if text is None:
            continue
        if any(c in text for c in "\r\n\0"):
            out.add("config.header_invalid", path, "a header value cannot hold line breaks")
            continue
        try:
            template_variables(text)
        except TemplateError as exc:
            out.add(exc.code, path, exc.message)
            continue
        result.append((str(name), text))
    return tuple(result)


def _models(out: _Problems, f: _Fields) -> tuple[str, ...] | None:
    if not f.has("models"):
        return None
    items = f.sequence("models")
    if items is None:
        return None
    if not items:
        out.add(
            "config.provider_models_empty",
            f.at("models"),
            "an empty models list offers nothing; leave it out to offer any model",
        )
        return None
    names: list[str] = []
    for i, item in enumerate(items):
        path = _at(f.at("models"), i)
        name = _as_model(out, path, item)
        if name is None:
            continue
        if name in names:
            out.add("config.provider_model_duplicate", path, f"{name!r} is listed twice")
            continue
        names.append(name)
    return tuple(names)


_SPEC_FIELDS = SECTIONS["providers[].model_specs.*"]


def _model_specs(out: _Problems, f: _Fields) -> tuple[tuple[str, ModelSpec], ...]:
    mapping = f.mapping("model_specs")
    if mapping is None:
        return ()
    specs: list[tuple[str, ModelSpec]] = []
    for model, value in mapping.items():
        path = _at(f.at("model_specs"), str(model))
        if not isinstance(model, str) or not model.strip():
            out.add("config.model_spec_blank", path, "a model spec needs a model name")
            continue
        if not _printable(out, path, model):
            continue
        if _WILDCARD.search(model):
            out.add(
                "config.model_spec_wildcard",
                path,
                f"{model!r} is a pattern; a model spec applies to one model",
            )
            continue
        if value is None or (isinstance(value, Mapping) and not value):
            out.add(
                "config.model_spec_empty", path, "set context_window, max_output_tokens or both"
            )
            continue
        sf = _Fields.of(out, path, value, _SPEC_FIELDS)
        if sf is None:
            continue
        figures: dict[str, int] = {}
        for field_name in _SPEC_FIELDS:
            raw = sf.raw(field_name)
            if raw is _ABSENT:
                continue
            fpath = sf.at(field_name)
            if isinstance(raw, int) and not isinstance(raw, bool) and raw <= 0:
                out.add(
                    "config.model_spec_zero",
                    fpath,
                    f"{field_name} must be a positive number of tokens, got {raw}",
                )
                continue
            found = _as_number(out, fpath, raw, defaults.MODEL_SPEC_TOKENS, "config.out_of_range")
            if found is not None:
                figures[field_name] = int(found)
        if not figures:
            if not any(sf.has(n) for n in _SPEC_FIELDS):
                out.add(
                    "config.model_spec_empty",
                    path,
                    "set context_window, max_output_tokens or both",
                )
            continue
        spec = ModelSpec(**figures)
        if (
            spec.context_window is not None
            and spec.max_output_tokens is not None
            and spec.max_output_tokens > spec.context_window
        ):
            out.add(
                "config.model_spec_output_exceeds_window",
                _at(path, "max_output_tokens"),
                f"max_output_tokens {spec.max_output_tokens} exceeds context_window "
                f"{spec.context_window}",
            )
            continue
        specs.append((model, spec))
    return tuple(specs)


def _providers(out: _Problems, top: _Fields) -> list[_Placed]:
    placed: list[_Placed] = []
    for path, item in _entries(out, top, "providers"):
        f = _Fields.of(out, path, item, SECTIONS["providers[]"])
        if f is None:
            continue
        name = f.name()
        bedrock = _bedrock(out, f)
        cloud = _cloud(out, f)
        vertex = cloud is not None and cloud[1] in (Dialect.GEMINI, Dialect.ANTHROPIC)
        if (bedrock is not None or vertex) and not f.has("base_url"):
            url = None  # the region's (location's) endpoint, at send time
        else:
            url_raw = f.required("base_url")
            url = None if url_raw is _ABSENT else _http_url(out, f.at("base_url"), url_raw)
        key = _as_secret(out, f.at("key"), f.raw("key")) if f.has("key") else None
        protocol = Dialect.ANTHROPIC if bedrock is not None else None
        if cloud is not None:
            protocol = cloud[1]
        elif protocol is None:
            protocol = f.choice("protocol", Dialect)
        recognised = False
        if protocol is None and not f.has("protocol"):
            host = url[1] if url else ""
            protocol = Dialect(defaults.OFFICIAL_HOSTS.get(host, Dialect.OPENAI_CHAT.value))
            recognised = True
        provider = Provider(
            name=name or "",
            base_url=url[0] if url else "",
            protocol=protocol or Dialect.OPENAI_CHAT,
            protocol_recognised=recognised,
            key=key,
            headers=_headers(out, f),
            models=_models(out, f),
            max_concurrent=f.integer(
                "max_concurrent",
                defaults.PROVIDER["max_concurrent"],
                code="config.provider_concurrency_range",
            ),
            billing=f.choice("billing", Billing, Billing.METERED),
            model_specs=_model_specs(out, f),
            price_sheet=f.name("price_sheet", required=False),
            connect_timeout_secs=f.number(
                "connect_timeout_secs", defaults.PROVIDER["connect_timeout_secs"]
            )
            or 10.0,
            max_answer_bytes=f.integer("max_answer_bytes", defaults.PROVIDER["max_answer_bytes"])
            or 64 * 1024 * 1024,
            forward_mock_headers=f.boolean("forward_mock_headers", False),
            http2=f.boolean("http2", False),
            realtime=f.boolean("realtime", False),
            responses_transport=_responses_transport(out, f, protocol),
            bedrock=bedrock,
            cloud=cloud[0] if cloud is not None else None,
        )
        if name is not None:
            placed.append(_Placed(path=path, value=provider))
    return placed


_AWS_FIELDS = ("region", "aws_access_key_id", "aws_secret_access_key", "aws_session_token")
_BEDROCK_FIELDS = (*_AWS_FIELDS, "count_tokens")


def _bedrock(out: _Problems, f: _Fields) -> BedrockSettings | None:
    """``protocol: bedrock-anthropic`` and ``bedrock-converse``'s AWS fields; None for any other
    protocol (where the
    AWS fields are refused)."""
    protocol = f.raw("protocol")
    if protocol not in (BEDROCK_ANTHROPIC, BEDROCK_CONVERSE):
        for field_name in _BEDROCK_FIELDS:
            if f.has(field_name):
                out.add(
                    "config.aws_field_protocol",
                    f.at(field_name),
                    f"{field_name} is a field of protocols {BEDROCK_ANTHROPIC} and "
                    f"{BEDROCK_CONVERSE} only",
                )
        return None
    values = [_as_secret(out, f.at(n), f.raw(n)) if f.has(n) else None for n in _AWS_FIELDS]
    region, key_id, secret, token = values
    return BedrockSettings(
        region=region,
        access_key_id=key_id,
        secret_access_key=secret,
        session_token=token,
        count_tokens=f.choice("count_tokens", BedrockCount, BedrockCount.UPSTREAM),
        converse=protocol == BEDROCK_CONVERSE,
    )


def _responses_transport(
    out: _Problems, f: _Fields, protocol: Dialect | None
) -> ResponsesTransport:
    """``responses_transport``: a Responses upstream's own WebSocket exists only for the
    ``openai-responses`` protocol."""
    transport = f.choice("responses_transport", ResponsesTransport, ResponsesTransport.HTTP)
    if transport is ResponsesTransport.WEBSOCKET and protocol not in (
        None,
        Dialect.OPENAI_RESPONSES,
    ):
        out.add(
            "config.responses_transport_protocol",
            f.at("responses_transport"),
            f"responses_transport: websocket needs protocol openai-responses, not {protocol}",
        )
        return ResponsesTransport.HTTP
    return transport
