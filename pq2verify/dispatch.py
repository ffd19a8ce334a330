"""Moved to kernels.dispatch (dispatch and pq2_matmul, part of the runtime); this name is the same module
while other files still import it."""
import sys

import kernels.dispatch as _moved

sys.modules[__name__] = _moved
