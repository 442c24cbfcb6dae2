"""``ts.protocol``: TorchServe's backend protocol, of which handlers use only the streaming call."""
