"""The request path over HTTP, gRPC, shared memory and the OpenAI frontend, against references and other servers."""
