"""Official SDK clients pointed at a running gateway: retries off, every call bounded.

`sdk_clients(url)` yields one client of each SDK (Anthropic, OpenAI — Chat and Responses share
it — and google-genai) and closes them all afterwards, so a module can make them once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import anthropic
import httpx2
import openai
from google import genai
from google.genai import types as gtypes

from tests.twserve.support.stack import KEY

__all__ = ["SdkClients", "sdk_clients"]


@dataclass(frozen=True, slots=True)
class SdkClients:
    anthropic: anthropic.Anthropic
    openai: openai.OpenAI
    genai: genai.Client


@contextmanager
def sdk_clients(url: str, *, key: str = KEY, timeout: float = 5.0) -> Iterator[SdkClients]:
    """Clients of the three SDKs for the gateway at `url`, closed when the block ends."""
    with ExitStack() as exits:
        http_client = exits.enter_context(httpx2.Client(timeout=timeout))
        gemini = genai.Client(
            api_key=key,
            http_options=gtypes.HttpOptions(
                base_url=url,
                timeout=int(timeout * 1000),
                retry_options=gtypes.HttpRetryOptions(attempts=1),
            ),
        )
        exits.callback(gemini.close)
        yield SdkClients(
            anthropic=anthropic.Anthropic(
                base_url=url,
                api_key=key,
                max_retries=0,
                timeout=timeout,
                http_client=http_client,
            ),
            openai=openai.OpenAI(
                base_url=url + "/v1",
                api_key=key,
                max_retries=0,
                timeout=timeout,
                http_client=http_client,
            ),
            genai=gemini,
        )
