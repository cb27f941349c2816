import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Burns CPU in Python for the given number of seconds (parallel only across processes)."""

    def execute(self, requests):
        responses = []
        for request in requests:
            seconds = float(pb_utils.get_input_tensor_by_name(request, "SECONDS").as_numpy()[0])
            deadline = time.perf_counter() + seconds
            total = 0
            while time.perf_counter() < deadline:
                total += sum(range(1000))
            pid = pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64))
            responses.append(pb_utils.InferenceResponse([pid]))
        return responses
