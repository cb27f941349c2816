import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0].decode()
            if mode == "raise":
                raise ValueError("execute raised on purpose")
            if mode == "error":
                error = pb_utils.TritonError("the input is not acceptable", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
            else:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OK", np.array([True]))]))
        return responses
