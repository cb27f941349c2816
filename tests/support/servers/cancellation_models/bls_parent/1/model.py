import numpy as np
import triton_python_backend_utils as pb_utils

CALLS = 5


class TritonPythonModel:
    """Makes CALLS BLS requests to 'sleepy', one after the other; answers how many failed."""

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            failed = 0
            for _ in range(CALLS):
                call = pb_utils.InferenceRequest(
                    model_name="sleepy", inputs=[x], requested_output_names=["Y"]
                )
                failed += call.exec().has_error()
            responses.append(
                pb_utils.InferenceResponse([pb_utils.Tensor("FAILED", np.array([failed], np.int32))])
            )
        return responses
