"""KServe V2 over gRPC (inference.GRPCInferenceService)."""
