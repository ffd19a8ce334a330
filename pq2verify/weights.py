"""Moved to kernels.format (the runtime's weight format); this name is the same module while
other files still import it."""
import sys

import kernels.format as _format

sys.modules[__name__] = _format
