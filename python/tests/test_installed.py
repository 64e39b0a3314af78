"""An installed strata (the wheel's, or go install's with STRATA_TEST_BIN)
finds every plugin next to itself and exports fixtures that reproduce
transformers under ONNX Runtime."""

import json
import os
import shutil
import subprocess

import pytest
from conftest import FIXTURES, PLUGINS, assert_reproduces_transformers, clean_env, fixture, installed_bin


def strata(tmp_path, *args, check=True):
    proc = subprocess.run([os.path.join(installed_bin(), "strata"), *args], capture_output=True, text=True, env=clean_env(tmp_path))
    if check and proc.returncode != 0:
        pytest.fail(f"strata {' '.join(args)}: exit {proc.returncode}\n{proc.stderr}")
    return proc


def test_archs_lists_every_plugin_next_to_strata(tmp_path):
    found = json.loads(strata(tmp_path, "archs", "--json").stdout)["plugins"]
    assert sorted(p["name"] for p in found) == PLUGINS
    for p in found:
        assert not p.get("error"), p
        assert p["found_via"] == "next to strata" and os.path.dirname(p["path"]) == installed_bin(), p


def test_archs_without_plugins_fails_saying_where_it_looked(tmp_path):
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(os.path.join(installed_bin(), "strata"), alone / "strata")
    proc = subprocess.run([str(alone / "strata"), "archs"], capture_output=True, text=True, env=clean_env(tmp_path))
    assert proc.returncode == 1, proc
    assert "no strata-plugin-* binaries found; looked in:" in proc.stderr and f"{alone} (next to strata)" in proc.stderr, proc.stderr


def test_version(tmp_path):
    lines = strata(tmp_path, "version").stdout.splitlines()
    assert lines[0].startswith("strata ") and lines[2] == "plugin protocol 1", lines


@pytest.mark.parametrize("name", FIXTURES)
def test_export_reproduces_transformers(name, tmp_path):
    model, _, _ = fixture(name)
    out = tmp_path / "out"
    strata(tmp_path, "export", model, "--out", str(out), "--quiet")
    assert_reproduces_transformers(name, out)
