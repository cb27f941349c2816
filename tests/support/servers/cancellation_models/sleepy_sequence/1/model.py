import time

import triton_python_backend_utils as pb_utils

SECONDS = 0.5
SLICE = 0.02


class TritonPythonModel:
    """Echoes X as Y after half a second; a request cancelled meanwhile ends at once, CANCELLED."""

    def execute(self, requests):
        responses = []
        for request in requests:
            deadline = time.monotonic() + SECONDS
            while time.monotonic() < deadline and not request.is_cancelled():
                time.sleep(SLICE)
            if request.is_cancelled():
                error = pb_utils.TritonError("cancelled while sleeping", pb_utils.TritonError.CANCELLED)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
        return responses
