import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        # As on Triton, the configuration comes with the model's name, backend and version policy.
        seen = auto_complete_model_config.as_dict()
        if (seen["name"], seen["backend"], seen["version_policy"]) != (
            "autocomplete",
            "python",
            {"latest": {"num_versions": 1}},
        ):
            raise ValueError(f"the configuration came without what Triton fills in: {seen}")
        auto_complete_model_config.set_max_batch_size(4)
        auto_complete_model_config.add_input({"name": "X", "data_type": "TYPE_INT32", "dims": [2]})
        auto_complete_model_config.add_output({"name": "DOUBLE", "data_type": "TYPE_INT32", "dims": [2]})
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("DOUBLE", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * 2)]
            )
            for r in requests
        ]
