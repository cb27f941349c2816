import os

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Writes a file when finalized; the file's path comes from the environment."""

    def initialize(self, args):
        self.marker = os.environ["CORESERVE_TEST_MARKER"]

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())]
            )
            for r in requests
        ]

    def finalize(self):
        with open(self.marker, "w") as file:
            file.write("finalized")
