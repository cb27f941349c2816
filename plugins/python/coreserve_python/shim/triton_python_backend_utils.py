"""`import triton_python_backend_utils as pb_utils`, as a Triton model.py does, inside coreserve's stubs."""

# Triton's module imports these at its top: models may reach them as pb_utils.np and so on.
import json  # noqa: F401
import struct  # noqa: F401

import numpy as np  # noqa: F401

from coreserve_python.pb_utils import *  # noqa: F403
from coreserve_python.pb_utils import __all__  # noqa: F401
