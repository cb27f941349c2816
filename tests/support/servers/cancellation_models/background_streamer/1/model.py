import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

# Responses the model still sends after it saw the cancellation (the server drops them).
AFTER_CANCELLATION = 5


class TritonPythonModel:
    """Streams up to N responses from a thread, after execute() returned; once cancelled it
    sends a few more responses and then the final flag, as a careless model might."""

    def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            threading.Thread(target=self._stream, args=(request.get_response_sender(), count)).start()
        return None

    def _stream(self, sender, count):
        sent = 0
        while sent < count and not sender.is_cancelled():
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("VALUE", np.array([sent], np.int32))]))
            sent += 1
            time.sleep(0.002)
        if sender.is_cancelled():
            for extra in range(AFTER_CANCELLATION):
                value = pb_utils.Tensor("VALUE", np.array([-1 - extra], np.int32))
                sender.send(pb_utils.InferenceResponse([value]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        pb_utils.Logger.log_info(f"background streamer ended after {sent} of {count} responses")
