import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Burns CPU in Python for the given number of seconds (parallel only across processes).

    Answers its process id and the span it ran (wall-clock start and end, for the test to
    see whether two executions overlapped).
    """

    def execute(self, requests):
        responses = []
        for request in requests:
            seconds = float(pb_utils.get_input_tensor_by_name(request, "SECONDS").as_numpy()[0])
            started = time.time()
            deadline = time.perf_counter() + seconds
            total = 0
            while time.perf_counter() < deadline:
                total += sum(range(1000))
            pid = pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64))
            span = pb_utils.Tensor("SPAN", np.array([started, time.time()], dtype=np.float64))
            responses.append(pb_utils.InferenceResponse([pid, span]))
        return responses
