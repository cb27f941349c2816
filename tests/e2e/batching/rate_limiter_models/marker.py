"""A Python model that records when each execution enters and leaves, for the rate limiter tests.

Configuration parameters: `markers`, the file every instance appends "enter <model>" and
"exit <model>" lines to (one write each, O_APPEND, so lines of several processes never mix);
`gate`, a file whose absence holds the execution (at most 60 s) once it has entered.
Each request's X is answered as Y after X milliseconds.
"""

import json
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        parameters = config.get("parameters", {})
        self.name = config["name"]
        self.markers = parameters["markers"]["string_value"]
        self.gate = parameters.get("gate", {}).get("string_value", "")

    def _mark(self, event):
        descriptor = os.open(self.markers, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(descriptor, f"{event} {self.name}\n".encode())
        finally:
            os.close(descriptor)

    def execute(self, requests):
        self._mark("enter")
        deadline = time.monotonic() + 60
        while self.gate and not os.path.exists(self.gate) and time.monotonic() < deadline:
            time.sleep(0.01)
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            time.sleep(int(x.reshape(-1)[0]) / 1000)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
        self._mark("exit")
        return responses
