import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])
        output_config = pb_utils.get_output_config_by_name(self.model_config, "OUTPUT0")
        self.output_dtype = pb_utils.triton_string_to_numpy(output_config["data_type"])
        self.args = args

    def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            out_0 = pb_utils.Tensor("OUTPUT0", (in_0.as_numpy() + 1).astype(self.output_dtype))
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[out_0],
                    parameters={
                        "instance": self.args["model_instance_name"],
                        "kind": self.args["model_instance_kind"],
                        "version": self.args["model_version"],
                        "request_id": request.request_id(),
                        "echo": json.loads(request.parameters()).get("echo", ""),
                    },
                )
            )
        return responses
