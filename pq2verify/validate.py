"""Moved to kernels.validate (the bad-input contract, part of the runtime); this name is the same module
while other files still import it."""
import sys

import kernels.validate as _moved

sys.modules[__name__] = _moved
