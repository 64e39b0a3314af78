"""check_plugin.py, the check of a plugin from anywhere (docs/plugins.md):
on a fixture of the suite with the in-tree plugins it passes and reports
the logits' difference; it fails when the reference is not the
checkpoint's, and when the model_type is served by a plugin outside
--plugin-dir. (make test-outoftree runs it on examples/plugin-outoftree.)"""

import os
import subprocess
import sys

import numpy as np

from test_conformance import HERE, ROOT, Fixture

SCRIPT = os.path.join(HERE, "check_plugin.py")
BIN = os.path.join(ROOT, "bin")


def check(model, reference, plugin_dir):
    return subprocess.run([sys.executable, SCRIPT, "check", model, "--reference", reference, "--plugin-dir", plugin_dir],
                          capture_output=True, text=True)


def test_passes_on_a_fixture():
    fx = Fixture("mistral-f32-sliding")
    proc = check(fx.model, os.path.join(fx.dir, "reference.npz"), BIN)
    assert proc.returncode == 0, proc.stderr
    assert "mistral 0.1.0" in proc.stdout and "OK: max |Δlogits|" in proc.stdout


def test_fails_on_other_logits(tmp_path):
    fx = Fixture("mistral-f32-sliding")
    ref = dict(fx.ref)
    ref["logits"] = ref["logits"] + 1e-3
    np.savez(tmp_path / "ref.npz", **ref)
    proc = check(fx.model, str(tmp_path / "ref.npz"), BIN)
    assert proc.returncode == 1 and "FAIL: logits differ from transformers" in proc.stderr, proc.stderr


def test_refuses_a_plugin_found_elsewhere(tmp_path):
    """An empty --plugin-dir: the fixture's model_type is served by the plugin
    next to strata, which is not the one asked about."""
    fx = Fixture("mistral-f32-sliding")
    proc = check(fx.model, os.path.join(fx.dir, "reference.npz"), str(tmp_path))
    assert proc.returncode == 1 and f"not a plugin of {tmp_path}" in proc.stderr, proc.stderr
