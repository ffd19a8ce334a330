import sys; from .report import html as _m; sys.modules[__name__] = _m  # noqa: E702  the old name, re-exported
