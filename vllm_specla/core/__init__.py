"""The SpecLA core: state slots and factor banks, drafting, acceptance, the draft-length policy (vLLM-free)."""

import numbers


def is_int(x) -> bool:
    """An integer argument: Python or numpy ints, not bool (``True`` is an ``int``; every argument check uses this)."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def is_real(x) -> bool:
    """A real-number argument: Python or numpy ints and floats, not bool (NaN included: range checks reject it)."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)
