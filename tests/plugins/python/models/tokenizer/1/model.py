import zlib

import numpy as np
import triton_python_backend_utils as pb_utils

LENGTH = 8
VOCABULARY = 1000


def token_id(word):
    return 1 + zlib.crc32(word.lower().encode("utf-8")) % (VOCABULARY - 1)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            texts = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            ids = np.zeros((len(texts), LENGTH), dtype=np.int64)
            mask = np.zeros((len(texts), LENGTH), dtype=np.int64)
            for row, text in enumerate(texts.reshape(-1)):
                words = text.decode("utf-8").split()[:LENGTH]
                ids[row, : len(words)] = [token_id(word) for word in words]
                mask[row, : len(words)] = 1
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("input_ids", ids), pb_utils.Tensor("attention_mask", mask)]
                )
            )
        return responses
