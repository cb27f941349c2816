import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            sender = request.get_response_sender()
            # Responses may come from another thread after execute returns, as in Triton.
            threading.Thread(target=self.stream, args=(sender, count)).start()
        return None

    def stream(self, sender, count):
        for value in range(count, 0, -1):
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("VALUE", np.array([value], np.int32))]))
            time.sleep(0.01)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
