"""Moved to kernels.emulation (the torch emulation of the paths' arithmetic, part of the runtime); this name is the same module
while other files still import it."""
import sys

import kernels.emulation as _moved

sys.modules[__name__] = _moved
