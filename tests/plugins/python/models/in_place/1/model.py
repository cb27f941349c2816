import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Adds one to its input in place (inputs are writable arrays, as on Triton) and echoes TEXT."""

    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            data += 1
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            upper = np.array([item.upper() for item in text], dtype=np.object_)
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUTPUT0", data), pb_utils.Tensor("TEXT_OUT", upper)]
                )
            )
        return responses
