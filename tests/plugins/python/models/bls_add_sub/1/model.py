import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Calls an ONNX model through the server (BLS) and returns its OUTPUT0, or its error."""

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
            target = pb_utils.get_input_tensor_by_name(request, "MODEL").as_numpy()[0].decode()
            bls = pb_utils.InferenceRequest(
                model_name=target,
                inputs=[pb_utils.Tensor("INPUT0", a), pb_utils.Tensor("INPUT1", np.ones_like(a))],
                requested_output_names=["OUTPUT0"],
            )
            response = bls.exec()
            if response.has_error():
                total = np.zeros_like(a)
                error = response.error().message()
            else:
                total = pb_utils.get_output_tensor_by_name(response, "OUTPUT0").as_numpy()
                error = ""
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("SUM", total),
                        pb_utils.Tensor("ERROR", np.array([error.encode()], dtype=object)),
                    ]
                )
            )
        return responses
