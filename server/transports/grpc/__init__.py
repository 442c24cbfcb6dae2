"""What every gRPC service of ovserve shares: the server engine, health, reflection,
calls in flight for the drain, and the one mapping of errors to gRPC status codes."""
