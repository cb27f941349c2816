class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("the weights file is missing")

    def execute(self, requests):
        return []

    def finalize(self):  # never called: initialize() raised (Triton's rule)
        print("broken_init finalized", flush=True)
