"""KServe V1 and V2 REST, as one ASGI application."""
