"""Requests shaped like the traffic of Claude Code 2.1 and Codex CLI 0.171 (docs/conversion.md
describes how they convert).

The bodies are built, not stored: a real Claude Code request is ~100 KB and a Codex one ~40 KB,
mostly tool descriptions and system prompts. The builder reproduces their *shape* — the fields,
their nesting and order, the kinds of tools and message items, the headers — and pads the prose
to the observed sizes with deterministic filler, so a test gets the same bytes on every run.

Each builder returns an `AgentRequest`: the path the agent posts to, its headers (with the
gateway key left to the caller) and the body as the agent serialises it (compact JSON with
non-ASCII text kept as UTF-8, as Node's JSON.stringify and Rust's serde_json write it), so a
test can check that a same-format upstream receives those exact bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CLAUDE_CODE_BETAS",
    "AgentRequest",
    "claude_code_request",
    "codex_request",
]

CLAUDE_CODE_BETAS = (
    "claude-code-20250219",
    "interleaved-thinking-2025-05-14",
    "context-management-2025-06-27",
    "prompt-caching-scope-2026-01-05",
    "effort-2025-11-24",
    "mid-conversation-system-2026-02-01",
    "fine-grained-tool-streaming-2025-05-14",
    "tool-search-tool-2025-10-19",
)

_SESSION = "5d0f6c0e-8a1b-4c55-9a7e-3f2b1d9c4e77"
_THREAD = "019a3c2e-7d41-7b52-a8f0-2c6e9b1d4f30"

# Prose for padding: the kind of text agent prompts are made of, with a little non-ASCII so a
# re-encoding (\u escapes, NFC) would change the bytes.
_SENTENCES = (
    "Read the file before editing it, and keep the existing style of the surrounding code.",
    "Prefer the dedicated tool over a shell command when one exists for the job.",
    "Never commit unless the user asks; never push without an explicit request.",
    "When several independent reads are needed, issue them in one message so they run in parallel.",
    'Quote paths that contain spaces — e.g. "/tmp/my dir/notes.md" — and use absolute paths.',
    "Results longer than 30000 characters are truncated before they are returned to you.",
    "Keep answers short: the user reads them in a terminal, 80 columns wide, often over SSH.",
    "Use the todo list for work with three or more steps, marking each item done as you go.",
    "Résumé, naïve, 日本語 and emoji like ✅ must survive a round trip unchanged.",
    "If a hook blocks a tool call, adjust the call rather than retrying the same one.",
)


def _prose(size: int, seed: int) -> str:
    """About `size` characters of sentences, starting at sentence `seed`."""
    parts: list[str] = []
    total = 0
    i = seed
    while total < size:
        sentence = _SENTENCES[i % len(_SENTENCES)]
        parts.append(sentence)
        total += len(sentence) + 1
        i += 1
    return " ".join(parts)


def _compact(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass(frozen=True, slots=True)
class AgentRequest:
    path: str  # with the query string, as the agent sends it
    headers: tuple[tuple[str, str], ...]  # without the key
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


# --- Claude Code ------------------------------------------------------------------------------

# (name, description size, properties) — the tools Claude Code 2.1 declares, with their
# parameters; descriptions are padded to roughly the real lengths.
_CLAUDE_TOOLS: tuple[tuple[str, int, dict[str, Any], tuple[str, ...]], ...] = (
    (
        "Task",
        4200,
        {
            "description": {"type": "string", "description": "A short (3-5 word) description"},
            "prompt": {"type": "string", "description": "The task for the agent to perform"},
            "subagent_type": {"type": "string", "description": "The type of agent to use"},
        },
        ("description", "prompt", "subagent_type"),
    ),
    (
        "Bash",
        9800,
        {
            "command": {"type": "string", "description": "The command to execute"},
            "timeout": {"type": "number", "description": "Optional timeout in milliseconds"},
            "description": {"type": "string", "description": "What this command does"},
            "run_in_background": {"type": "boolean", "description": "Run in the background"},
            "dangerouslyDisableSandbox": {"type": "boolean"},
        },
        ("command",),
    ),
    (
        "Glob",
        900,
        {
            "pattern": {"type": "string", "description": "The glob pattern to match files"},
            "path": {"type": "string", "description": "The directory to search in"},
        },
        ("pattern",),
    ),
    (
        "Grep",
        2400,
        {
            "pattern": {"type": "string"},
            "path": {"type": "string"},
            "glob": {"type": "string"},
            "output_mode": {
                "type": "string",
                "enum": ["content", "files_with_matches", "count"],
            },
            "-B": {"type": "number"},
            "-A": {"type": "number"},
            "-C": {"type": "number"},
            "-n": {"type": "boolean"},
            "-i": {"type": "boolean"},
            "type": {"type": "string"},
            "head_limit": {"type": "number"},
            "multiline": {"type": "boolean"},
        },
        ("pattern",),
    ),
    (
        "ExitPlanMode",
        1300,
        {"plan": {"type": "string", "description": "The plan you came up with"}},
        ("plan",),
    ),
    (
        "Read",
        2100,
        {
            "file_path": {"type": "string", "description": "The absolute path to the file"},
            "offset": {"type": "number"},
            "limit": {"type": "number"},
        },
        ("file_path",),
    ),
    (
        "Edit",
        1500,
        {
            "file_path": {"type": "string"},
            "old_string": {"type": "string"},
            "new_string": {"type": "string"},
            "replace_all": {"type": "boolean", "default": False},
        },
        ("file_path", "old_string", "new_string"),
    ),
    (
        "Write",
        900,
        {"file_path": {"type": "string"}, "content": {"type": "string"}},
        ("file_path", "content"),
    ),
    (
        "NotebookEdit",
        900,
        {
            "notebook_path": {"type": "string"},
            "cell_id": {"type": "string"},
            "new_source": {"type": "string"},
            "cell_type": {"type": "string", "enum": ["code", "markdown"]},
            "edit_mode": {"type": "string", "enum": ["replace", "insert", "delete"]},
        },
        ("notebook_path", "new_source"),
    ),
    (
        "WebFetch",
        1400,
        {
            "url": {"type": "string", "format": "uri"},
            "prompt": {"type": "string"},
        },
        ("url", "prompt"),
    ),
    (
        "TodoWrite",
        9000,
        {
            "todos": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "content": {"type": "string", "minLength": 1},
                        "status": {
                            "type": "string",
                            "enum": ["pending", "in_progress", "completed"],
                        },
                        "activeForm": {"type": "string", "minLength": 1},
                    },
                    "required": ["content", "status", "activeForm"],
                    "additionalProperties": False,
                },
            }
        },
        ("todos",),
    ),
    (
        "WebSearch",
        1200,
        {
            "query": {"type": "string", "minLength": 2},
            "allowed_domains": {"type": "array", "items": {"type": "string"}},
            "blocked_domains": {"type": "array", "items": {"type": "string"}},
        },
        ("query",),
    ),
    (
        "BashOutput",
        500,
        {"bash_id": {"type": "string"}, "filter": {"type": "string"}},
        ("bash_id",),
    ),
    ("KillShell", 300, {"shell_id": {"type": "string"}}, ("shell_id",)),
    (
        "AskUserQuestion",
        2000,
        {
            "questions": {
                "type": "array",
                "minItems": 1,
                "maxItems": 4,
                "items": {
                    "type": "object",
                    "properties": {
                        "question": {"type": "string"},
                        "header": {"type": "string"},
                        "options": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "properties": {
                                    "label": {"type": "string"},
                                    "description": {"type": "string"},
                                },
                                "required": ["label", "description"],
                            },
                        },
                        "multiSelect": {"type": "boolean"},
                    },
                    "required": ["question", "header", "options", "multiSelect"],
                },
            }
        },
        ("questions",),
    ),
    ("Skill", 1600, {"command": {"type": "string"}}, ("command",)),
    ("SlashCommand", 1100, {"command": {"type": "string"}}, ("command",)),
    ("EnterPlanMode", 800, {}, ()),
    (
        "ListMcpResourcesTool",
        500,
        {"server": {"type": "string"}},
        (),
    ),
    (
        "ReadMcpResourceTool",
        400,
        {"server": {"type": "string"}, "uri": {"type": "string"}},
        ("server", "uri"),
    ),
    (
        "mcp__ide__getDiagnostics",
        300,
        {"uri": {"type": "string"}},
        (),
    ),
    (
        "mcp__ide__executeCode",
        600,
        {"code": {"type": "string"}},
        ("code",),
    ),
    (
        "mcp__github__search_issues",
        700,
        {
            "q": {"type": "string"},
            "per_page": {"type": "integer", "minimum": 1, "maximum": 100},
            "page": {"type": "integer", "exclusiveMinimum": 0},
        },
        ("q",),
    ),
    (
        "mcp__github__get_file_contents",
        500,
        {
            "owner": {"type": "string"},
            "repo": {"type": "string"},
            "path": {"type": "string"},
            "ref": {"type": "string"},
        },
        ("owner", "repo", "path"),
    ),
)


def _claude_tool(index: int, spec: tuple[str, int, dict[str, Any], tuple[str, ...]]) -> Any:
    name, size, properties, required = spec
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    schema["additionalProperties"] = False
    schema["$schema"] = "http://json-schema.org/draft-07/schema#"
    return {"name": name, "description": _prose(size, index), "input_schema": schema}


def claude_code_request(
    model: str = "claude-opus-4-1", *, target_size: int = 100_000
) -> AgentRequest:
    """A mid-session Claude Code turn: a tool round done, a new user message, streamed."""
    system: list[dict[str, Any]] = [
        {
            "type": "text",
            "text": "x-anthropic-billing-header: cc_version=2.1.3; cc_entrypoint=cli",
        },
        {
            "type": "text",
            "text": "You are Claude Code, Anthropic's official CLI for Claude.",
            "cache_control": {"type": "ephemeral"},
        },
        {
            "type": "text",
            "text": "You are an interactive CLI tool that helps users with software "
            "engineering tasks. " + _prose(14_000, 3),
            "cache_control": {"type": "ephemeral"},
        },
    ]
    tools = [_claude_tool(i, spec) for i, spec in enumerate(_CLAUDE_TOOLS)]
    reminder = "<system-reminder>\n" + _prose(3_000, 5) + "\n</system-reminder>"
    messages: list[Any] = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": reminder},
                {"type": "text", "text": "Find where the retry schedule lives and explain it."},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {
                    "type": "thinking",
                    "thinking": "The user wants the retry schedule. I should search for it.",
                    "signature": "EqQBCkYIBxgCKkBv" + "Q" * 300 + "GAE=",
                },
                {"type": "text", "text": "I'll search the repository for the schedule."},
                {
                    "type": "tool_use",
                    "id": "toolu_01A09q90qw90lq917835lq9",
                    "name": "Grep",
                    "input": {"pattern": "SCHEDULE_SECS", "output_mode": "content", "-n": True},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01A09q90qw90lq917835lq9",
                    "content": "twengine/retry.py:21:SCHEDULE_SECS = (2.0, 4.0, 8.0, 16.0)\n"
                    "twengine/retry.py:33:    return SCHEDULE_SECS[min(round_, 4) - 1]",
                },
            ],
        },
        {
            "role": "system",
            "content": "The user has switched to plan mode. Do not edit files until the plan "
            "is approved.",
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "text",
                    "text": "Now summarise it in two lines — with the jitter.",
                    "cache_control": {"type": "ephemeral"},
                }
            ],
        },
    ]
    user_id = json.dumps(
        {
            "device_id": "a3f1" * 16,
            "account_uuid": "8c1e7a52-3b7d-4f0e-9a61-2d5c8e4b1f09",
            "session_id": _SESSION,
        },
        separators=(",", ":"),
    )
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "system": system,
        "tools": tools,
        "metadata": {"user_id": user_id},
        "max_tokens": 32000,
        "thinking": {"type": "enabled", "budget_tokens": 31999},
        "context_management": {
            "edits": [{"type": "clear_thinking_20251015", "keep": "all"}],
        },
        "stream": True,
    }
    # Pad the long system block so the whole body lands at the observed size.
    raw = _compact(body)
    if len(raw) < target_size:
        system[2]["text"] += " " + _prose(target_size - len(raw), 7)
        raw = _compact(body)
    headers = (
        ("accept", "application/json"),
        ("anthropic-beta", ",".join(CLAUDE_CODE_BETAS)),
        ("anthropic-dangerous-direct-browser-access", "true"),
        ("anthropic-version", "2023-06-01"),
        ("content-type", "application/json"),
        ("user-agent", "claude-cli/2.1.3 (external, cli)"),
        ("x-app", "cli"),
        ("x-claude-code-session-id", _SESSION),
        ("x-stainless-arch", "x64"),
        ("x-stainless-helper-method", "stream"),
        ("x-stainless-lang", "js"),
        ("x-stainless-os", "Linux"),
        ("x-stainless-package-version", "0.70.0"),
        ("x-stainless-retry-count", "0"),
        ("x-stainless-runtime", "node"),
        ("x-stainless-runtime-version", "v24.3.0"),
        ("x-stainless-timeout", "600"),
    )
    return AgentRequest(path="/v1/messages?beta=true", headers=headers, body=raw)


# --- Codex CLI --------------------------------------------------------------------------------

_APPLY_PATCH_GRAMMAR = r"""start: begin_patch hunk+ end_patch
begin_patch: "*** Begin Patch" LF
end_patch: "*** End Patch" LF?
hunk: add_hunk | delete_hunk | update_hunk
add_hunk: "*** Add File: " filename LF add_line+
delete_hunk: "*** Delete File: " filename LF
update_hunk: "*** Update File: " filename LF change_move? change?
filename: /(.+)/
add_line: "+" /(.*)/ LF -> line
change_move: "*** Move to: " filename LF
change: (change_context | change_line)+ eof_line?
change_context: ("@@" | "@@ " /(.+)/) LF
change_line: ("+" | "-" | " ") /(.*)/ LF
eof_line: "*** End of File" LF
%import common.LF
"""


def _fn(name: str, description: str, properties: dict[str, Any], required: list[str]) -> Any:
    return {
        "type": "function",
        "name": name,
        "description": description,
        "strict": False,
        "parameters": {
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": False,
        },
    }


def codex_request(
    model: str = "gpt-5.1-codex",
    *,
    path: str = "/backend-api/codex/responses",
    target_size: int = 40_000,
) -> AgentRequest:
    """A Codex CLI turn after one shell call, streamed, with every kind of tool it declares."""
    tools: list[Any] = [
        _fn(
            "shell",
            "Runs a shell command and returns its output. " + _prose(1_500, 1),
            {
                "command": {"type": "array", "items": {"type": "string"}},
                "workdir": {"type": "string"},
                "timeout_ms": {"type": "number"},
                "with_escalated_permissions": {"type": "boolean"},
                "justification": {"type": "string"},
            },
            ["command"],
        ),
        {
            "type": "custom",
            "name": "apply_patch",
            "description": "Use the `apply_patch` tool to edit files. " + _prose(1_200, 2),
            "format": {"type": "grammar", "syntax": "lark", "definition": _APPLY_PATCH_GRAMMAR},
        },
        _fn(
            "update_plan",
            "Updates the task plan. " + _prose(600, 3),
            {
                "explanation": {"type": "string"},
                "plan": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "step": {"type": "string"},
                            "status": {"type": "string"},
                        },
                        "required": ["step", "status"],
                        "additionalProperties": False,
                    },
                },
            },
            ["plan"],
        ),
        _fn(
            "view_image",
            "Attach a local image to the conversation.",
            {"path": {"type": "string"}},
            ["path"],
        ),
        {
            "type": "namespace",
            "name": "mcp__github",
            "description": "Tools of the GitHub MCP server.",
            "tools": [
                _fn(
                    "search_issues",
                    "Search issues and pull requests. " + _prose(400, 4),
                    {"q": {"type": "string"}, "per_page": {"type": "integer"}},
                    ["q"],
                ),
                _fn(
                    "get_file_contents",
                    "Read a file from a repository.",
                    {
                        "owner": {"type": "string"},
                        "repo": {"type": "string"},
                        "path": {"type": "string"},
                    },
                    ["owner", "repo", "path"],
                ),
            ],
        },
        {"type": "tool_search", "max_num_results": 8},
        {"type": "web_search", "external_web_access": True},
    ]
    developer = (
        "You are Codex, based on GPT-5. You are running as a coding agent in the Codex CLI on a "
        "user's computer. " + _prose(12_000, 0)
    )
    environment = (
        "<environment_context>\n  <cwd>/work/main</cwd>\n  <approval_policy>on-request"
        "</approval_policy>\n  <sandbox_mode>workspace-write</sandbox_mode>\n  <network_access>"
        "restricted</network_access>\n  <shell>bash</shell>\n</environment_context>"
    )
    agents_md = (
        "# AGENTS.md instructions for /work/main\n\n<INSTRUCTIONS>\n"
        + _prose(4_000, 6)
        + "\n</INSTRUCTIONS>"
    )
    call_id = "call_3xQ8mZ1vR7nT2kLw9pYb4DcE"
    input_items: list[Any] = [
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": developer}],
        },
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": agents_md}]},
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": environment}],
        },
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Which tests cover the retry schedule?"}],
        },
        {
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": "**Searching for retry tests**"}],
            "content": None,
            "encrypted_content": "gAAAAABo" + "x7Kq" * 120,
        },
        {
            "type": "function_call",
            "id": "fc_68e4b2c1d5a08193a1b2c3d4e5f60718",
            "name": "shell",
            "arguments": json.dumps(
                {"command": ["bash", "-lc", "rg -n next_backoff tests"], "workdir": "/work/main"},
                separators=(",", ":"),
            ),
            "call_id": call_id,
        },
        {
            "type": "function_call_output",
            "call_id": call_id,
            "output": "tests/twengine/test_retry.py:12:from twengine.retry import next_backoff\n"
            "tests/twengine/test_retry.py:30:def test_pause_grows() -> None:",
        },
        {
            "type": "message",
            "role": "developer",
            "content": [
                {"type": "input_text", "text": "<permissions>approval: on-request</permissions>"}
            ],
        },
    ]
    # No "instructions": Codex sends its system prompt as developer messages.
    body: dict[str, Any] = {
        "model": model,
        "input": input_items,
        "tools": tools,
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": _THREAD,
        "text": {"verbosity": "medium"},
        "client_metadata": {"originator": "codex_cli_rs", "session_id": _THREAD},
    }
    raw = _compact(body)
    if len(raw) < target_size:
        input_items[0]["content"][0]["text"] += " " + _prose(target_size - len(raw), 8)
        raw = _compact(body)
    turn_metadata = json.dumps(
        {"turn_id": "019a3c2e-9f10-7c33-b1d2-6a7e8f9a0b1c", "sandbox": "workspace-write"},
        separators=(",", ":"),
    )
    headers = (
        ("accept", "text/event-stream"),
        ("content-type", "application/json"),
        ("originator", "codex_cli_rs"),
        ("session-id", _THREAD),
        ("thread-id", _THREAD),
        ("user-agent", "codex_cli_rs/0.171.0 (Ubuntu 24.4.0; x86_64) xterm-256color"),
        ("version", "0.171.0"),
        ("x-client-request-id", "019a3c2e-a0b1-7d44-c2e3-7f8a9b0c1d2e"),
        ("x-codex-beta-features", "unified_exec"),
        ("x-codex-turn-metadata", turn_metadata),
    )
    return AgentRequest(path=path, headers=headers, body=raw)
