import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        if any(pb_utils.get_input_tensor_by_name(r, "CRASH").as_numpy()[0] for r in requests):
            os._exit(3)  # the stub dies mid-request
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("PID", np.array([os.getpid()], np.int64))])
            for _ in requests
        ]
