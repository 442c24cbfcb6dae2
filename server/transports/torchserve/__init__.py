"""TorchServe's gRPC inference and management APIs, over the data plane."""
