"""Moved to kernels.sets (the kernel sets, part of the runtime); this name is the same module
while other files still import it."""
import sys

import kernels.sets as _moved

sys.modules[__name__] = _moved
