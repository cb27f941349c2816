import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Streams up to N responses; stops as soon as its response sender says it was cancelled."""

    def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            sender = request.get_response_sender()
            sent = 0
            while sent < count and not sender.is_cancelled():
                value = pb_utils.Tensor("VALUE", np.array([sent], np.int32))
                sender.send(pb_utils.InferenceResponse([value]))
                sent += 1
                time.sleep(0.002)
            if sender.is_cancelled():
                pb_utils.Logger.log_info(
                    f"streamer stopped after {sent} of {count} responses: cancelled "
                    f"(request.is_cancelled()={request.is_cancelled()})"
                )
                error = pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)
                sender.send(
                    pb_utils.InferenceResponse(error=error),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
            else:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
