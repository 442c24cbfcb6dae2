"""``ts.handler_utils``: the helpers TorchServe gives handlers."""
