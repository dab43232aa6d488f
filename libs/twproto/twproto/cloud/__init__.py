"""Cloud platforms as upstreams: Google Vertex AI (``vertex-gemini``, ``vertex-anthropic``) and
Azure OpenAI (``azure-openai``). Each module writes its platform's paths, body changes and
credential headers; `twproto.upstream_request` puts them together (docs/cloud.md)."""

from twproto.cloud.azure import AzureRoute, azure_body, azure_key_headers, azure_path
from twproto.cloud.vertex import (
    VERTEX_ANTHROPIC_VERSION,
    VertexPublisher,
    VertexRoute,
    vertex_anthropic_body,
    vertex_base_url,
    vertex_path,
)

__all__ = (
    "VERTEX_ANTHROPIC_VERSION",
    "AzureRoute",
    "VertexPublisher",
    "VertexRoute",
    "azure_body",
    "azure_key_headers",
    "azure_path",
    "vertex_anthropic_body",
    "vertex_base_url",
    "vertex_path",
)
