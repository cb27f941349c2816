"""An OpenAI-compatible frontend (`--openai-port`): /v1/models, completions, chat, embeddings.

It is an optional extra (`pip install 'core-server[openai]'`, which brings jinja2 for chat
templates). Nothing here is imported unless the frontend is started: `frontend.OpenAIFrontend`
is the entry point, over the same data plane as the KServe frontends.
"""
