"""The strata commands as Python functions, each returning the command's
``--json`` result."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from ._run import flags, run

PathLike = str | os.PathLike[str]


def export(model: PathLike, out: PathLike, *, layerwise: bool = False, window_size: int | None = None,
           plugin_dirs: Iterable[PathLike] = (), progress: bool = False, **options: Any) -> dict[str, Any]:
    """Exports MODEL (a checkpoint directory, or a hub id in the local Hugging
    Face cache) to ``out/model.onnx`` and ``out/weight_spec.json``: ``strata
    export MODEL --out OUT``. layerwise exports windows of window_size
    decoder layers and stitches them. Further keyword arguments are export's
    flags and the plugin's options, underscores for dashes:
    ``dtype="float16"``, ``weights="materialize"``, ``keep_windows=True``,
    ``jobs=4``, ``moe_strategy="dense"`` (``strata archs`` lists them).

    Returns the JSON summary (``files``, ``layers``, ``plugin``, ...)."""
    return run(["export", model, "--out", out,
                *flags({"layerwise": layerwise, "window_size": window_size, **options})],
               plugin_dirs=plugin_dirs, progress=progress)


def inspect(model: PathLike, *, revision: str | None = None, plugin_dirs: Iterable[PathLike] = ()) -> dict[str, Any]:
    """Describes MODEL: architecture, plugin, layers, parameters, dtypes,
    shards and whether strata can export it (``strata inspect --json``).
    A checkpoint strata cannot export raises StrataError whose ``result``
    holds this same description with the reasons."""
    return run(["inspect", model, *flags({"revision": revision})], plugin_dirs=plugin_dirs)


def convert(model: PathLike, out: PathLike, *, dtype: str | None = None, quantize: str | None = None,
            layers: str | tuple[int, int] | None = None, tasks: int | None = None, finalize: bool = False,
            jobs: int | None = None, plugin_dirs: Iterable[PathLike] = (), progress: bool = False,
            **options: Any) -> dict[str, Any]:
    """Re-writes MODEL layer by layer into ``out`` (``strata convert``):
    dtype ``"bfloat16"``/``"float16"``/``"float32"``, quantize ``"none"``,
    ``"fp8-block"`` or ``"fp8-dynamic"``. layers: ``(first, last)``
    (inclusive), ``"first-last"``, or ``"auto"`` for this scheduler task's
    share (``tasks`` tasks; docs/convert.md); then ``finalize=True`` once.

    Returns the JSON summary (``layers_written``, ``finalized``, ...)."""
    if isinstance(layers, tuple):
        layers = f"{layers[0]}-{layers[1]}"
    return run(["convert", model, "--out", out,
                *flags({"dtype": dtype, "quantize": quantize, "layers": layers, "tasks": tasks,
                        "finalize": finalize, "jobs": jobs, **options})],
               plugin_dirs=plugin_dirs, progress=progress)


def compile(model: PathLike, out: PathLike, *, backend: str | None = None, plugin_dirs: Iterable[PathLike] = (),
            progress: bool = False, **options: Any) -> dict[str, Any]:
    """Compiles an export directory, or a checkpoint (exported into
    ``out/export`` first), with qaic-compile or ONNX Runtime
    (``strata compile``): backend ``"qaic"`` or ``"ort"``; further keyword
    arguments are compile's and export's flags (``dry_run=True``,
    ``ctx_len=4096``, ``layerwise=True``, ...).

    Returns the JSON summary (``binaries``, ``export``, ...)."""
    return run(["compile", model, "--out", out, *flags({"backend": backend, **options})],
               plugin_dirs=plugin_dirs, progress=progress)


def archs(*, plugin_dirs: Iterable[PathLike] = ()) -> dict[str, Any]:
    """The plugins found, with their architectures, capabilities and options,
    and where strata looked (``strata archs --json``). Raises StrataError
    when none is found."""
    return run(["archs"], plugin_dirs=plugin_dirs)


def version() -> str:
    """``strata version``: strata's version, the Go version and the plugin
    protocol, as text."""
    return run(["version"], json_result=False)
