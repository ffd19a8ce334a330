"""Moved to kernels.backend (the backend key and kernel mode, part of the runtime); this name is the same module
while other files still import it."""
import sys

import kernels.backend as _moved

sys.modules[__name__] = _moved
