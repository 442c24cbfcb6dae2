"""Components that run beside a predictor: the transformer and the explainer.

Both call the predictor through :class:`ovserve.client.PredictorClient` and serve
the same KServe V1/V2 surface as the predictor itself.
"""
