import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Collects every response of the decoupled 'countdown' model through a decoupled BLS call."""

    def execute(self, requests):
        responses = []
        for request in requests:
            n = pb_utils.get_input_tensor_by_name(request, "N")
            call = pb_utils.InferenceRequest(
                model_name="countdown", inputs=[n], requested_output_names=["VALUE"]
            )
            values = []
            for response in call.exec(decoupled=True):
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
                if len(response.output_tensors()) > 0:
                    values.append(int(pb_utils.get_output_tensor_by_name(response, "VALUE").as_numpy()[0]))
            responses.append(
                pb_utils.InferenceResponse([pb_utils.Tensor("VALUES", np.array(values, np.int32))])
            )
        return responses
