"""Shared by the install tests: the repository, the installed binaries
under test, and the comparison with a conformance fixture's transformers
reference (conformance/ortrun.py, the suite's runner and tolerance)."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "conformance"))
import ortrun  # noqa: E402

TOLERANCE = 1e-4  # test_conformance.py's: float32 on both sides
# Fixtures exported by the install tests: two plugins, one layerwise.
FIXTURES = ["llama-f32-base", "qwen3-f32-bias-tied"]
PLUGINS = sorted(d[len("strata-plugin-"):] for d in os.listdir(os.path.join(ROOT, "cmd")) if d.startswith("strata-plugin-"))


def installed_bin():
    """The directory of the strata under test: STRATA_TEST_BIN (go install's
    GOBIN), else the strata package's own (the wheel's scripts)."""
    if d := os.environ.get("STRATA_TEST_BIN"):
        return os.path.abspath(d)
    import strata

    return os.path.dirname(strata.binary())


def clean_env(tmp_path):
    """An environment where strata finds plugins only next to itself."""
    env = {k: v for k, v in os.environ.items() if k not in ("STRATA_PLUGIN_PATH", "STRATA_BINARY")}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg")
    return env


def fixture(name):
    d = os.path.join(ROOT, "conformance", "fixtures", name)
    with open(os.path.join(d, "fixture.json")) as f:
        meta = json.load(f)
    return os.path.join(d, "model"), np.load(os.path.join(d, "reference.npz")), meta


def assert_reproduces_transformers(name, out):
    """out/model.onnx under ONNX Runtime gives the fixture's transformers
    logits (prefill and decode steps) within TOLERANCE."""
    _, ref, meta = fixture(name)
    sess = ortrun.session(os.path.join(out, "model.onnx"))
    got = ortrun.run(sess, ref["prompts"], ref["prompt_lengths"], ref["decode_tokens"], meta["ctx_len"])
    diff = float(np.abs(got - ref["logits"]).max())
    assert diff <= TOLERANCE, f"{name}: logits differ from transformers by {diff:.2e}"


@pytest.fixture(scope="session")
def fake_plugin_dir(tmp_path_factory):
    """internal/fakeplugin as strata-plugin-fake-hang-on-plan: claims llama
    and never answers Plan, so an export waits until interrupted."""
    if shutil.which("go") is None:
        pytest.fail("the Ctrl-C test builds internal/fakeplugin with go, which is not on PATH: install Go (make test needs it)")
    d = tmp_path_factory.mktemp("hang")
    subprocess.run(["go", "build", "-o", str(d / "strata-plugin-fake-hang-on-plan"), "./internal/fakeplugin"], cwd=ROOT, check=True)
    return str(d)
