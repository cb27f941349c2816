import time

import numpy as np
import triton_python_backend_utils as pb_utils

SECONDS = 0.5


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            started = time.time()
            time.sleep(SECONDS)
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            span = np.array([started, time.time()], dtype=np.float64)
            responses.append(
                pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value * 3), pb_utils.Tensor("SPAN", span)])
            )
        return responses
