"""Helpers the four format modules share: dropped-field bookkeeping, data URLs, tool flattening,
ids, usage arithmetic and error typing.

Tool flattening: only Responses has namespace tools and free-form (custom) tools. Every other
format gets a namespace's functions under flat names (``namespace__function``) and a custom tool
as a function taking one string (``{"input": string}``). `tool_names_for` computes the same
renaming from a request so that the answer's calls can be mapped back (`ir.ToolNames`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from twproto import _json, ir
from twproto.dialect import Dialect
from twproto.errors import GatewayError, error_for_stream_event

NAMESPACE_SEPARATOR = "__"

#: What reading a JSON value of an unexpected shape raises deep inside a decoder (a list where an
#: object belongs, a number where a string does). Decoders catch these at their boundary.
#: RecursionError too: JSON is read to 1024 levels, deeper than Python's stack lets a recursive
#: walk (a schema, the text of a value that is a nested list) go.
MALFORMED = (AttributeError, TypeError, KeyError, IndexError, ValueError, RecursionError)

# The schema a custom (free-form) tool gets in formats that only have JSON-schema functions.
CUSTOM_TOOL_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"input": {"type": "string", "description": "The tool's free-form input."}},
    "required": ["input"],
}

EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


class Dropped:
    """An ordered set of what a conversion could not carry."""

    __slots__ = ("_items", "_seen")

    def __init__(self, initial: Iterable[str] = ()) -> None:
        self._items: list[str] = []
        self._seen: set[str] = set()
        for item in initial:
            self.add(item)

    def add(self, item: str) -> None:
        if item not in self._seen:
            self._seen.add(item)
            self._items.append(item)

    def extend(self, items: Iterable[str]) -> None:
        for item in items:
            self.add(item)

    def __bool__(self) -> bool:
        return bool(self._items)

    def tuple(self) -> tuple[str, ...]:
        return tuple(self._items)


def merge_dropped(*groups: Iterable[str]) -> tuple[str, ...]:
    out = Dropped()
    for group in groups:
        out.extend(group)
    return out.tuple()


# ----------------------------------------------------------------------------------------------
# JSON helpers


def json_text(obj: Any) -> str:
    """Compact JSON text (str) of `obj`."""
    return _json.dumps(obj).decode()


def parse_arguments(arguments: str) -> tuple[dict[str, Any], bool]:
    """Tool-call arguments as an object; (``{}``, False) when they are not a JSON object."""
    if not arguments:
        return {}, True
    try:
        value = _json.loads(arguments)
    except _json.JSONDecodeError:
        return {}, False
    if isinstance(value, dict):
        return value, True
    return {}, False


def need_str(value: Any) -> str:
    """`value` if it is a string; raises TypeError (one of `MALFORMED`) otherwise."""
    if value.__class__ is str:
        text: str = value
        return text
    raise TypeError(f"expected a string, not {type(value).__name__}")


def need_int(value: Any) -> int:
    """`value` if it is an integer (not a bool); raises TypeError otherwise."""
    if value.__class__ is int:
        number: int = value
        return number
    raise TypeError(f"expected an integer, not {type(value).__name__}")


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def as_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def as_int(value: Any) -> int:
    # bool is an int subclass; a true/false token count is malformed input, not 1/0.
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return 0


def opt_int(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


def opt_float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    return None


def opt_bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


# ----------------------------------------------------------------------------------------------
# Images


def parse_data_url(url: str) -> tuple[str, str] | None:
    """``data:<type>;base64,<data>`` → (media type, base64 data); None for other URLs."""
    if not url.startswith("data:"):
        return None
    head, sep, data = url[5:].partition(",")
    if not sep or not head.endswith(";base64"):
        return None
    return head[: -len(";base64")] or "application/octet-stream", data


def data_url(media_type: str | None, data: str) -> str:
    return f"data:{media_type or 'application/octet-stream'};base64,{data}"


def image_from_url(url: str, detail: str | None = None) -> ir.Image:
    parsed = parse_data_url(url)
    if parsed is not None:
        return ir.Image(data=parsed[1], media_type=parsed[0], detail=detail)
    return ir.Image(url=url, detail=detail)


_BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}|[A-Za-z0-9_-]*={0,2}")
_URL_SAFE = str.maketrans("-_", "+/")


def standard_base64(value: str) -> str:
    """`value` in the standard base64 alphabet, padded. Google's SDKs write bytes fields
    (``inlineData.data``) URL-safe, which Gemini accepts and the other APIs refuse."""
    if "-" not in value and "_" not in value and len(value) % 4 == 0:
        return value
    value = value.translate(_URL_SAFE).rstrip("=")
    return value + "=" * (-len(value) % 4)


def is_base64(value: str) -> bool:
    """Whether `value` is base64 (standard or URL-safe alphabet): what Gemini's bytes fields
    (``thoughtSignature``) accept."""
    if not value or _BASE64.fullmatch(value) is None:
        return False
    return len(value.rstrip("=")) % 4 != 1


# ----------------------------------------------------------------------------------------------
# Tools


def flat_name(name: str, namespace: str | None) -> str:
    return f"{namespace}{NAMESPACE_SEPARATOR}{name}" if namespace else name


def builtin_tool(tool: ir.Tool, dialect: Dialect, dropped: Dropped) -> dict[str, Any] | None:
    """A provider's built-in tool (web search, code execution…) as `dialect` writes it: only the
    format it came from has it, so for any other it is recorded as dropped (None)."""
    if tool.dialect is dialect and tool.raw is not None:
        return dict(tool.raw)
    dropped.add(f"tools:{tool.name}")
    return None


def flatten_tool(tool: ir.Tool) -> ir.Tool:
    """A namespace or custom tool as a plain function (for formats without either)."""
    if tool.kind is ir.ToolKind.CUSTOM:
        return ir.Tool(
            name=flat_name(tool.name, tool.namespace),
            description=tool.description,
            parameters=CUSTOM_TOOL_PARAMETERS,
            cache_control=tool.cache_control,
        )
    if tool.namespace:
        description = tool.description
        if tool.namespace_description and not description:
            description = tool.namespace_description
        return ir.Tool(
            name=flat_name(tool.name, tool.namespace),
            description=description,
            parameters=tool.parameters,
            strict=tool.strict,
            cache_control=tool.cache_control,
        )
    return tool


def tool_names_for(tools: Iterable[ir.Tool], target: Dialect) -> ir.ToolNames:
    """The renaming a conversion to `target` applies to `tools` (see the module notes)."""
    if target is Dialect.OPENAI_RESPONSES:
        return ir.ToolNames()
    entries: list[tuple[str, ir.ToolName]] = []
    for tool in tools:
        if tool.kind is ir.ToolKind.BUILTIN:
            continue
        if tool.kind is ir.ToolKind.CUSTOM or tool.namespace:
            entries.append(
                (
                    flat_name(tool.name, tool.namespace),
                    ir.ToolName(name=tool.name, namespace=tool.namespace, tool_kind=tool.kind),
                )
            )
    return ir.ToolNames(entries=tuple(entries))


def flatten_call(call: ir.ToolCall) -> ir.ToolCall:
    if call.tool_kind is ir.ToolKind.FUNCTION and not call.namespace:
        return call
    return ir.ToolCall(
        id=call.id,
        name=flat_name(call.name, call.namespace),
        arguments=call.arguments,
        item_id=call.item_id,
        cache_control=call.cache_control,
    )


def custom_input(arguments: str) -> str:
    """The free-form input of a custom tool call from its IR arguments (``{"input": …}``)."""
    obj, ok = parse_arguments(arguments)
    value = obj.get("input") if ok else None
    if isinstance(value, str):
        return value
    # A model that answered with other keys: pass its arguments through as the input.
    return arguments if not ok or obj else ""


def custom_arguments(text: str) -> str:
    return json_text({"input": text})


def carry_extras(out: dict[str, Any], req: ir.Request, *, same: bool, dropped: Dropped) -> None:
    """The source format's fields with no IR slot: written back for the same format (never
    over a field the encoder set), recorded as dropped for any other."""
    for key, value in req.extras.items():
        if same:
            out.setdefault(key, value)
        else:
            dropped.add(key)


def drop_cache_control(req: ir.Request, *, same: bool, dropped: Dropped) -> None:
    """Formats without Anthropic's explicit cache markers: prompt caching is automatic (OpenAI)
    or set up by other means (Gemini), so the markers are recorded as dropped."""
    if not same and has_cache_control(req):
        dropped.add("cache_control")


def has_cache_control(req: ir.Request) -> bool:
    """Whether any part, system text or tool of `req` carries an Anthropic cache marker."""
    if any(t.cache_control is not None for t in req.system):
        return True
    if any(t.cache_control is not None for t in req.tools):
        return True
    for message in req.messages:
        for part in message.parts:
            if getattr(part, "cache_control", None) is not None:
                return True
            if isinstance(part, ir.ToolResult) and any(
                p.cache_control is not None for p in part.content
            ):
                return True
    return False


def call_kinds(messages: Iterable[ir.Message]) -> dict[str, ir.ToolCall]:
    """Call id → the call, over a conversation (for matching results to their calls)."""
    out: dict[str, ir.ToolCall] = {}
    for message in messages:
        for part in message.parts:
            if isinstance(part, ir.ToolCall):
                out[part.id] = part
    return out


# ----------------------------------------------------------------------------------------------
# Ids


_ID_PREFIXES = ("msg_", "chatcmpl-", "resp_")


def prefixed_id(prefix: str, upstream_id: str) -> str:
    """An id in the client format's style, derived from the upstream's (deterministic): another
    format's prefix is swapped for `prefix` (``msg_01Ab`` → ``resp_01Ab``)."""
    if not upstream_id:
        return prefix + "gateway"
    if upstream_id.startswith(prefix):
        return upstream_id
    for other in _ID_PREFIXES:
        if upstream_id.startswith(other) and len(upstream_id) > len(other):
            return prefix + upstream_id[len(other) :]
    return prefix + upstream_id


# ----------------------------------------------------------------------------------------------
# Stop reasons and errors


def usage_or_zero(usage: ir.Usage | None) -> ir.Usage:
    return usage if usage is not None else ir.Usage()


# Upstream in-stream error type/code → HTTP status it stands for.
_ERROR_STATUS: Mapping[str, int] = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "rate_limit_exceeded": 429,
    "insufficient_quota": 429,
    "usage_limit_reached": 429,
    "resource_exhausted": 429,
    "api_error": 500,
    "server_error": 500,
    "internal": 500,
    "unavailable": 503,
    "timeout_error": 504,
    "deadline_exceeded": 504,
    "overloaded_error": 529,
    "invalid_argument": 400,
    "unauthenticated": 401,
    "permission_denied": 403,
    "not_found": 404,
}


def error_status(error_type: str | None, fallback: int = 500) -> int:
    if not error_type:
        return fallback
    return _ERROR_STATUS.get(error_type.lower(), fallback)


def gateway_error(event: ir.StreamErrorEvent) -> GatewayError:
    """An upstream's in-stream error as the error the client's format reports."""
    return error_for_stream_event(event)


# ----------------------------------------------------------------------------------------------
# Stream plumbing


class _Null:
    """A handler that ignores everything (the watch path only keeps the decoder's own state)."""

    def message_start(
        self, id: str, model: str, created: int | None, usage: ir.Usage | None
    ) -> None:
        pass

    def part_start(self, index: int, part: ir.PartKind, item_id: str | None) -> None:
        pass

    def tool_call_start(
        self,
        index: int,
        id: str,
        name: str,
        tool_kind: ir.ToolKind,
        namespace: str | None,
        item_id: str | None,
    ) -> None:
        pass

    def text(self, index: int, text: str) -> None:
        pass

    def reasoning(self, index: int, text: str) -> None:
        pass

    def reasoning_seal(
        self,
        index: int,
        signature: str | None,
        encrypted_content: str | None,
        redacted_data: str | None,
    ) -> None:
        pass

    def tool_args(self, index: int, arguments: str) -> None:
        pass

    def part_stop(self, index: int) -> None:
        pass

    def usage(self, usage: ir.Usage) -> None:
        pass

    def finish(self, reason: ir.StopReason, stop_sequence: str | None) -> None:
        pass

    def end(self) -> None:
        pass

    def error(self, error: ir.StreamErrorEvent) -> None:
        pass


NULL_HANDLER = _Null()
