"""A toy tokenizer: lower-cased words hashed into the classifier's 1000-token vocabulary."""

import re
import zlib

import numpy as np
import triton_python_backend_utils as pb_utils

LENGTH = 16
VOCABULARY = 1000


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            texts = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().reshape(-1)
            ids = np.zeros((len(texts), LENGTH), dtype=np.int64)
            mask = np.zeros((len(texts), LENGTH), dtype=np.int64)
            for row, text in enumerate(texts):
                words = re.findall(r"[a-z']+", text.decode("utf-8", errors="replace").lower())[:LENGTH]
                ids[row, : len(words)] = [1 + zlib.crc32(w.encode()) % (VOCABULARY - 1) for w in words]
                mask[row, : len(words)] = 1
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("input_ids", ids), pb_utils.Tensor("attention_mask", mask)]
                )
            )
        return responses
