"""strata convert-bin against torch itself: views torch.save keeps (stride
0, overlapping rows, transposes, tied tensors) come out as torch.load reads
them, bit for bit; an archive holding data.pkl twice, which torch loads
reading the last copy (the first is what a reader by index sees), is
refused by name (issue 30).

Needs bin/strata (make build) and .venv/client (torch, safetensors).
"""

import os
import subprocess
import zipfile

import pytest
import safetensors.torch as st
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
STRATA = os.environ.get("STRATA", os.path.join(ROOT, "bin", "strata"))
CONFIG = '{"architectures": ["LlamaForCausalLM"], "model_type": "llama"}'


def convert_bin(src, out, *args):
    if not os.access(STRATA, os.X_OK):
        pytest.fail(f"{STRATA} is missing: build it first (make build)")
    return subprocess.run([STRATA, "convert-bin", str(src), "--out", str(out), *args], capture_output=True, text=True)


def views():
    base = torch.arange(24, dtype=torch.float32) / 7
    return {
        "broadcast": base[:4].expand(3, 4),  # stride (0, 1)
        "overlap": base.as_strided((5, 3), (2, 1), 1),  # rows share elements
        "window": base.unfold(0, 6, 3),  # sliding windows, as unfold makes them
        "transposed": base[:12].view(3, 4).t(),
        "tied_a": base,
        "tied_b": base,
        "half": base.to(torch.bfloat16)[::2],  # every other element
    }


def test_views_are_written_as_torch_reads_them(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(CONFIG)
    sd = views()
    torch.save(sd, src / "pytorch_model.bin")
    out = tmp_path / "out"
    proc = convert_bin(src, out)
    assert proc.returncode == 0, proc.stderr
    got = st.load_file(str(out / "model.safetensors"))
    loaded = torch.load(src / "pytorch_model.bin", weights_only=True)
    assert sorted(got) == sorted(sd)
    for k, v in loaded.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
        assert torch.equal(got[k], v.contiguous()), k


def test_a_second_data_pkl_is_refused(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(CONFIG)
    archive = src / "pytorch_model.bin"
    torch.save({"w": torch.ones(2)}, archive)
    other = tmp_path / "other.bin"
    torch.save({"evil": torch.zeros(2)}, other)
    with zipfile.ZipFile(other) as z:
        pkl = z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))
        name = next(n for n in zipfile.ZipFile(archive).namelist() if n.endswith("/data.pkl"))
    with pytest.warns(UserWarning, match="Duplicate name"), zipfile.ZipFile(archive, "a", compression=zipfile.ZIP_STORED) as z:
        z.writestr(name, pkl)
    assert list(torch.load(archive, weights_only=True)) == ["evil"]  # torch reads the last copy
    proc = convert_bin(src, tmp_path / "out")
    assert proc.returncode == 1 and f'holds "{name}" twice' in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()
