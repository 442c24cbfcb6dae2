"""A minimal transformer handler: scale the inputs, round the outputs.

    ovserve transformer --handler examples/transformer/scale.py:Scale \
        --model_name linear --predictor_host localhost:8080 --http_port 8090
"""
import numpy as np

from ovserve.server import Transformer


class Scale(Transformer):
    factor = 10.0

    async def preprocess(self, request, headers):
        # request.inputs: tensors with .name, .datatype and a numpy .data (the shape follows .data)
        for t in request.inputs:
            t.data = t.data * self.factor
        return request

    def postprocess(self, response, headers):  # a plain def runs in a worker thread
        for t in response.outputs:
            t.data = np.round(t.data / self.factor, 3)
        return response
