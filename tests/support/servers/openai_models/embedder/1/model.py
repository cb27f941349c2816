"""Embeds each text as a unit vector of its hashed character trigrams (zlib.crc32: stable)."""

import zlib

import numpy as np
import triton_python_backend_utils as pb_utils

DIMENSIONS = 16


def embed(text):
    vector = np.zeros(DIMENSIONS, dtype=np.float32)
    padded = f"  {text} "
    for index in range(len(padded) - 2):
        vector[zlib.crc32(padded[index : index + 3].encode("utf-8")) % DIMENSIONS] += 1.0
    return vector / max(float(np.linalg.norm(vector)), 1e-9)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            texts = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)
            decoded = [text.decode("utf-8") for text in texts]
            vectors = np.stack([embed(text) for text in decoded])
            counts = np.array([[len(text)] for text in decoded], dtype=np.uint32)
            outputs = [pb_utils.Tensor("embedding", vectors), pb_utils.Tensor("num_input_tokens", counts)]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
