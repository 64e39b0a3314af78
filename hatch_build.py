"""Hatchling build hook: builds strata and every plugin with the Go
toolchain and adds them to the wheel as scripts, so pip installs them
beside one another on the environment's PATH (strata finds its plugins
next to itself), under a platform tag (the binaries are native code)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
import tempfile
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class GoBinariesHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        go = os.environ.get("GO", "go")
        if shutil.which(go) is None:
            raise RuntimeError(f"building the strata wheel needs the Go toolchain (go 1.26 or later; {go!r} is not on PATH): "
                               "install it from https://go.dev/dl, or set GO to its path")
        self._out = tempfile.mkdtemp(prefix="strata-wheel-")
        # -s -w: no symbol tables (the binaries are ~30% smaller). No
        # -trimpath: it would change every package's build cache key, so the
        # wheel would recompile all that make build or go install compiled.
        ldflags = f"-s -w -X main.version={self._version()}"
        cmd = [go, "build", "-ldflags", ldflags, "-o", self._out + os.sep, "./cmd/strata", "./cmd/strata-plugin-..."]
        self.app.display_info("building strata and its plugins: " + " ".join(cmd))
        subprocess.run(cmd, cwd=self.root, check=True)
        for name in sorted(os.listdir(self._out)):
            build_data["shared_scripts"][os.path.join(self._out, name)] = name
        build_data["pure_python"] = False
        build_data["tag"] = "py3-none-" + sysconfig.get_platform().replace("-", "_").replace(".", "_")

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        if getattr(self, "_out", None):
            shutil.rmtree(self._out, ignore_errors=True)

    def _version(self) -> str:
        """git describe in a checkout (as make build), else the package's."""
        try:
            return subprocess.run(["git", "describe", "--tags", "--always", "--dirty"], cwd=self.root, check=True,
                                  capture_output=True, text=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return self.metadata.version
