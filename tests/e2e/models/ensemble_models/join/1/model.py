import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [
                    pb_utils.Tensor(
                        "SUM",
                        pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
                        + pb_utils.get_input_tensor_by_name(r, "Y").as_numpy(),
                    )
                ]
            )
            for r in requests
        ]
