import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """`double`, slower than `countdown` takes to send its final flag after its last value."""

    def execute(self, requests):
        time.sleep(0.5)
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("DOUBLED", pb_utils.get_input_tensor_by_name(r, "VALUE").as_numpy() * 2)]
            )
            for r in requests
        ]
