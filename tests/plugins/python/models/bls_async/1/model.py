import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """An async execute that runs two BLS requests concurrently."""

    async def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
            inputs = [pb_utils.Tensor("INPUT0", a), pb_utils.Tensor("INPUT1", np.full_like(a, 2))]
            first = pb_utils.InferenceRequest(
                model_name="add_sub", inputs=inputs, requested_output_names=["OUTPUT0"]
            )
            second = pb_utils.InferenceRequest(
                model_name="add_sub", inputs=inputs, requested_output_names=["OUTPUT1"]
            )
            total, difference = await asyncio.gather(first.async_exec(), second.async_exec())
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor(
                            "SUM", pb_utils.get_output_tensor_by_name(total, "OUTPUT0").as_numpy()
                        ),
                        pb_utils.Tensor(
                            "DIFFERENCE", pb_utils.get_output_tensor_by_name(difference, "OUTPUT1").as_numpy()
                        ),
                    ]
                )
            )
        return responses
