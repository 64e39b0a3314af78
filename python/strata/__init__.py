"""strata from Python: export Hugging Face checkpoints to ONNX, inspect,
convert and compile them, through the ``strata`` binary this package
installs (its plugins beside it).

Each function runs ``strata <command> ... --json`` and returns the parsed
JSON result as a dict; a failure raises :class:`StrataError` (or
:class:`UsageError` for exit status 2) with strata's message and exit code.
Ctrl-C (KeyboardInterrupt, a notebook's "interrupt kernel") stops strata,
which removes its partial output, then re-raises KeyboardInterrupt.

    >>> import strata
    >>> result = strata.export("examples/tiny-llama/model", out="out/tiny", layerwise=True, window_size=1)
    >>> result["files"][0]["path"]
    'out/tiny/model.onnx'
"""

from __future__ import annotations

from ._api import archs, compile, convert, export, inspect, version
from ._run import StrataError, UsageError, binary, run

__all__ = ["StrataError", "UsageError", "archs", "binary", "compile", "convert", "export", "inspect", "run", "version"]
