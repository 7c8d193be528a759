"""vLLM general plugin (entry point group ``vllm.general_plugins``).

vLLM calls ``register()`` in every process it starts (API server, engine core,
workers), possibly more than once. Each feature lives in its own module with an
``install()`` that is idempotent, does nothing unless its environment variable
turns it on, and is harmless in processes that are not the engine core:

* ``acceptance_cap``  -- ``TABLETUNE_ACCEPTANCE_CAP=a1,a2,...`` (measurement aid, off by default)
* ``controller_hook`` -- ``TABLETUNE_PROFILE=<dir written by tabletune tune>``

The plugin fails open: an error while installing a feature is logged and the
engine starts without it.
"""

from __future__ import annotations

import importlib
import logging

from tabletune.errors import InputError

logger = logging.getLogger("tabletune.plugin")

FEATURES = (
    "tabletune.integrations.vllm.acceptance_cap",
    "tabletune.integrations.vllm.controller_hook",
)

_registered = False


def register() -> None:
    global _registered
    if _registered:
        return
    _registered = True
    if not _version_ok():
        return
    for name in FEATURES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue
            logger.warning("tabletune: cannot import %s: %s", name, exc)
            continue
        try:
            module.install()
        except Exception as exc:  # fail open: never break vLLM start-up
            logger.warning("tabletune: %s.install() failed, feature disabled: %r", name, exc)


def _version_ok() -> bool:
    """False (every feature off, logged once) on a vLLM without per-batch tables; a warning outside the
    tested range (``versions``)."""
    try:
        import vllm

        from tabletune.integrations.vllm import versions

        warning = versions.check(vllm.__version__)
    except InputError as exc:
        logger.warning("tabletune: plugin off: %s", exc)
        return False
    except Exception as exc:  # noqa: BLE001 -- fail open: a probe that fails leaves the features to decide
        logger.warning("tabletune: cannot check vLLM's version: %r", exc)
        return True
    if warning:
        logger.warning("tabletune: %s", warning)
    return True
