"""`import triton_python_backend_utils as pb_utils`, as a Triton model.py does, inside coreserve's stubs."""

from coreserve_python.pb_utils import *  # noqa: F403
from coreserve_python.pb_utils import __all__  # noqa: F401
