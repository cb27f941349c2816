import numpy as np
import triton_python_backend_utils as pb_utils

LABELS = np.array([b"negative", b"positive"], dtype=np.object_)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            logits = pb_utils.get_input_tensor_by_name(request, "logits").as_numpy()
            shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
            probabilities = shifted / shifted.sum(axis=1, keepdims=True)
            best = probabilities.argmax(axis=1)
            label = LABELS[best].reshape(-1, 1)
            score = probabilities[np.arange(len(best)), best].astype(np.float32).reshape(-1, 1)
            responses.append(
                pb_utils.InferenceResponse([pb_utils.Tensor("LABEL", label), pb_utils.Tensor("SCORE", score)])
            )
        return responses
