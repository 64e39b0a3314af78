"""The strata Python package as pip installed it (run in the wheel's fresh
virtualenv): its functions, their results and errors, Ctrl-C, and the
README's notebook example."""

import json
import os
import re
import signal
import struct
import subprocess
import sys
import sysconfig
import textwrap
import time

import pytest
import strata
from conftest import ROOT, assert_reproduces_transformers, fixture

TINY = os.path.join(ROOT, "examples", "tiny-llama", "model")


def test_the_installed_package_and_binaries_are_used():
    assert strata.__file__.startswith(sysconfig.get_path("purelib")), strata.__file__
    assert strata.binary() == os.path.join(sysconfig.get_path("scripts"), "strata")


@pytest.mark.parametrize("name,options", [("llama-f32-base", {"layerwise": True, "window_size": 1}),
                                          ("qwen3-f32-bias-tied", {})])
def test_export_reproduces_transformers(name, options, tmp_path):
    model, _, _ = fixture(name)
    result = strata.export(model, out=tmp_path / "out", **options)
    assert result["command"] == "export" and result["model_type"] in ("llama", "qwen3"), result
    assert str(tmp_path / "out" / "model.onnx") in [f["path"] for f in result["files"]]
    assert_reproduces_transformers(name, tmp_path / "out")


def test_inspect_returns_the_json_of_inspect():
    info = strata.inspect(TINY)
    assert info["model_type"] == "llama" and info["config"]["num_hidden_layers"] == 2, info


def test_convert_and_compile(tmp_path):
    part = strata.convert(TINY, tmp_path / "conv", dtype="float16", layers=(0, 0))
    assert part["layers_written"] == [0] and not part["finalized"], part
    whole = strata.convert(TINY, tmp_path / "conv", dtype="float16")
    assert whole["layers_kept"] == [0] and whole["layers_written"] == [1] and whole["finalized"], whole
    plan = strata.compile(TINY, tmp_path / "qpc", dry_run=True, ctx_len=64)
    assert plan["command"] == "compile" and any(f["path"].endswith("compile.sh") for f in plan["files"]), plan


@pytest.mark.parametrize("call,exc,code,message", [
    (lambda out: strata.export(TINY, out=out, dtype="int3"), strata.UsageError, 2, 'unknown compute dtype "int3"'),
    (lambda out: strata.export(TINY, out=out, no_such_option=True), strata.UsageError, 2, "no-such-option"),
    (lambda out: strata.export(os.path.join(ROOT, "no-such-model"), out=out), strata.StrataError, 1, "no-such-model"),
    (lambda out: strata.convert(TINY, out, layers="auto"), strata.UsageError, 2, "--layers auto: neither JOB_COMPLETION_INDEX"),
])
def test_errors_carry_message_and_exit_code(call, exc, code, message, tmp_path, monkeypatch):
    monkeypatch.delenv("JOB_COMPLETION_INDEX", raising=False)
    monkeypatch.delenv("SLURM_ARRAY_TASK_ID", raising=False)
    with pytest.raises(exc) as info:
        call(tmp_path / "out")
    assert info.value.exit_code == code and message in info.value.message, (info.value.exit_code, info.value.message)
    assert message in str(info.value) and info.value.args_[0] == strata.binary()


def test_flags_from_keyword_arguments():
    from strata._run import flags

    got = flags({"window_size": 4, "keep_windows": True, "subfunctions": False, "dtype": None,
                 "extra_model": ["vision", "embed"], "out": os.path.join("a", "b")})
    assert got == ["--window-size", "4", "--keep-windows", "--extra-model", "vision", "--extra-model", "embed",
                   "--out", os.path.join("a", "b")]


def strata_processes(marker):
    """pids of processes whose command line holds marker."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    pids.append(int(pid))
        except OSError:
            pass
    return pids


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_ctrl_c_stops_strata(fake_plugin_dir, tmp_path):
    """A KeyboardInterrupt in Python (SIGINT to Python alone, as a notebook's
    interrupt sends it) stops strata and its plugin, then propagates."""
    out = tmp_path / "interrupted-out"
    # Python as a terminal or notebook runs it: KeyboardInterrupt on SIGINT,
    # even when this test runs in the background, which ignores SIGINT.
    script = textwrap.dedent(f"""
        import signal
        signal.signal(signal.SIGINT, signal.default_int_handler)
        import strata
        strata.export({TINY!r}, out={str(out)!r}, plugin_dirs=[{fake_plugin_dir!r}])
    """)
    py = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        # strata started and its plugin with it: strata waits on Plan
        while not (any(p != py.pid for p in strata_processes(str(out))) and strata_processes(fake_plugin_dir)):
            assert time.monotonic() < deadline and py.poll() is None, "strata or its plugin never started"
            time.sleep(0.1)
        time.sleep(1)
        start = time.monotonic()
        py.send_signal(signal.SIGINT)
        _, err = py.communicate(timeout=30)
    finally:  # a failure leaves nothing running
        for pid in ([py.pid] if py.poll() is None else []) + strata_processes(str(out)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert py.returncode != 0 and "KeyboardInterrupt" in err, err
    assert time.monotonic() - start < 10, "strata took more than 10 s to stop"
    assert strata_processes(str(out)) == [] and strata_processes(fake_plugin_dir) == [], "strata or its plugin outlived Python"
    assert not (out / "model.onnx").exists()


def test_readme_notebook_example(tmp_path):
    """The README's example, as a notebook cell: exports with strata and
    greedy-decodes with ONNX Runtime, asserting transformers' tokens."""
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    block = re.search(r"<!-- begin python-example -->\n```python\n(.*?)```\n<!-- end python-example -->", readme, re.S)
    assert block, "README.md has no python-example block"
    proc = subprocess.run([sys.executable, "-c", block.group(1)], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "identical to transformers" in proc.stdout, proc.stdout


def test_inspect_of_an_unexportable_checkpoint_raises_with_the_description(tmp_path):
    """inspect exits 1 for a checkpoint no plugin handles, after printing its
    description: the exception carries both."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bogus", "architectures": ["BogusForCausalLM"]}))
    header = json.dumps({"model.layers.0.w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(4))
    with pytest.raises(strata.StrataError) as info:
        strata.inspect(tmp_path)
    err = info.value
    assert err.exit_code == 1 and "no plugin handles model_type bogus" in err.message, err.message
    assert err.result is not None and err.result["supported"] is False and err.result["model_type"] == "bogus", err.result
