"""Running the strata binary: where it is, its flags from keyword
arguments, its JSON result, its errors, and Ctrl-C."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Iterable, Mapping
from typing import IO, Any

# How long strata gets to stop its plugins and remove partial output after
# Ctrl-C before it is killed (it stops within a second; docs/convert.md).
INTERRUPT_GRACE_SECONDS = 10.0

_EXE = ".exe" if os.name == "nt" else ""


class StrataError(Exception):
    """strata failed. ``message`` is what strata said (its ``strata: error:``
    lines), ``exit_code`` its exit status, ``args_`` the command line,
    ``stderr`` all it wrote there, and ``result`` the JSON it printed anyway
    (``inspect`` prints one for a checkpoint it cannot export), if any."""

    def __init__(self, message: str, exit_code: int, args: list[str], stderr: str, result: dict[str, Any] | None = None):
        super().__init__(f"{message} (strata exit status {exit_code})")
        self.message = message
        self.exit_code = exit_code
        self.args_ = args
        self.stderr = stderr
        self.result = result


class UsageError(StrataError):
    """strata refused the command line (exit status 2): an unknown option or
    an invalid value; nothing was done."""


def binary() -> str:
    """The strata binary: $STRATA_BINARY if set, else the one this package
    installed into the environment's scripts directory, else ``strata`` on
    PATH. Raises FileNotFoundError saying how to get one."""
    if env := os.environ.get("STRATA_BINARY"):
        return env
    candidates = [os.path.join(sysconfig.get_path("scripts"), "strata" + _EXE)]
    if user := sysconfig.get_path("scripts", f"{os.name}_user"):
        candidates.append(os.path.join(user, "strata" + _EXE))
    for c in candidates:
        if os.access(c, os.X_OK):
            return c
    if found := shutil.which("strata"):
        return found
    raise FileNotFoundError(
        "no strata binary: looked in " + ", ".join(candidates) + " and on PATH; "
        "install the package with its binaries (pip install . at the strata repository's root), "
        "or set STRATA_BINARY to a strata built with make build"
    )


def flags(options: Mapping[str, Any]) -> list[str]:
    """Command-line flags from keyword arguments: ``window_size=4`` is
    ``--window-size 4``, ``True`` a bare flag, ``False``/``None`` omitted, a
    list or tuple the flag repeated. Plugin options go the same way
    (``moe_strategy="dense"`` is ``--moe-strategy dense``)."""
    out: list[str] = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            out.append(flag)
        elif isinstance(value, (list, tuple)):
            for v in value:
                out += [flag, _str(v)]
        else:
            out += [flag, _str(value)]
    return out


def _str(v: Any) -> str:
    return os.fspath(v) if isinstance(v, os.PathLike) else str(v)


def run(args: Iterable[str | os.PathLike[str]], *, json_result: bool = True, progress: bool = False,
        plugin_dirs: Iterable[str | os.PathLike[str]] = ()) -> Any:
    """Runs ``strata ARGS`` (with ``--json`` when json_result) and returns the
    parsed JSON, or stdout as text. plugin_dirs are given as --plugin-dir.
    progress: copy strata's stderr (progress lines) to sys.stderr as it
    comes. Raises StrataError/UsageError on a non-zero exit; on
    KeyboardInterrupt, stops strata (SIGINT, then SIGKILL after
    INTERRUPT_GRACE_SECONDS) and re-raises."""
    argv = [binary()]
    for d in plugin_dirs:
        argv += ["--plugin-dir", _str(d)]
    argv += [_str(a) for a in args]
    if json_result:
        argv.append("--json")
    # A session of its own: a terminal's Ctrl-C reaches Python only, which
    # forwards one SIGINT (a second one would make strata skip its cleanup).
    popen_extra: dict[str, Any] = {"start_new_session": True} if os.name == "posix" else {
        "creationflags": subprocess.CREATE_NEW_PROCESS_GROUP}  # type: ignore[attr-defined]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen_extra)
    stdout: list[bytes] = []
    stderr: list[bytes] = []
    readers = [threading.Thread(target=_drain, args=(proc.stdout, stdout, None), daemon=True),
               threading.Thread(target=_drain, args=(proc.stderr, stderr, sys.stderr if progress else None), daemon=True)]
    for r in readers:
        r.start()
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        _stop(proc)
        raise
    finally:
        for r in readers:
            r.join()
    out, err = b"".join(stdout).decode(), b"".join(stderr).decode(errors="replace")
    result = _parse(out) if json_result else out
    if code != 0:
        cls = UsageError if code == 2 else StrataError
        raise cls(_message(err, code), code, argv, err, result if isinstance(result, dict) else None)
    if json_result and result is None:
        raise StrataError(f"strata printed no JSON result: {out[:200]!r}", code, argv, err)
    return result


def _drain(pipe: IO[bytes] | None, into: list[bytes], echo: IO[str] | None) -> None:
    assert pipe is not None
    for line in iter(pipe.readline, b""):
        into.append(line)
        if echo is not None:
            echo.write(line.decode(errors="replace"))
            echo.flush()
    pipe.close()


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Ctrl-C for strata: it cancels, stops its plugins and removes partial
    output; killed only if it does not exit in time."""
    try:
        if os.name == "posix":
            proc.send_signal(signal.SIGINT)
        else:
            proc.send_signal(signal.CTRL_BREAK_EVENT)  # type: ignore[attr-defined]
        proc.wait(timeout=INTERRUPT_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _parse(out: str) -> dict[str, Any] | None:
    try:
        v = json.loads(out)
    except json.JSONDecodeError:
        return None
    return v if isinstance(v, dict) else None


def _message(stderr: str, code: int) -> str:
    """strata's error: from its first ``strata: error:`` line on (a message
    may span lines), else the last line of stderr."""
    lines = stderr.rstrip("\n").splitlines()
    for i, line in enumerate(lines):
        if line.startswith("strata: error: "):
            return "\n".join([line[len("strata: error: "):], *lines[i + 1:]])
    return lines[-1] if lines else f"strata exited with status {code} and said nothing"
