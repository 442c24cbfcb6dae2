"""The TorchServe component: handlers over OpenVINO models, the model store and archives (no torch, no gRPC)."""
