"""An OpenAI-compatible frontend (`--openai-port`): /v1/models, completions, chat, embeddings.

It is an optional extra (`pip install 'core-server[openai]'`, which brings jinja2 for chat
templates). The server imports this package only when the frontend is started;
`OpenAIFrontend` is its entry point, on the shared HTTP/1.1 server (`coreserve.server.httpd`)
over the same data plane as the KServe frontends. May import those two, the REST frontend's
status table and the layers below.
"""

from __future__ import annotations

from coreserve.server.openai._frontend import OpenAIFrontend

__all__ = ["OpenAIFrontend"]
