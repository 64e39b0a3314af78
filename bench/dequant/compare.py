#!/usr/bin/env python3
"""Which dequantisation graph form ONNX Runtime opens fastest and leanest.

strata exports quantised checkpoints weight-free: the quantised tensors stay
where they are in the checkpoint's safetensors shards, referenced as external
initializers, and the dequantisation is ONNX nodes over them at model level
(host/weights/transform/quant.go, lower.go). This script measures, for the
seven weights of one Llama-3.1-8B decoder layer (q_proj and o_proj 4096x4096,
k_proj and v_proj 1024x4096, gate_proj and up_proj 14336x4096, down_proj
4096x14336: 218M parameters), how onnxruntime.InferenceSession (CPU, default
options) opens and first runs a model whose seven outputs are the Gemm
(transB=1, as strata's blocks.Linear) of an input with each weight, when the
dequantisation is written in each of these forms:

  FP8 (FineGrainedFP8: F8_E4M3 [R, C] + float32 weight_scale_inv per 128x128):
    fp8_strata       strata's form, opset 17: the FP8 bytes as a UINT8
                     initializer, Cast to int32, Gather from the 256-entry
                     float32 table, Reshape to [1, SR, 128, SC, 128], Mul by
                     the scale reshaped to [1, SR, 1, SC, 1], Reshape back.
    fp8_strata_edge  strata's form for partial edge blocks (forced here on
                     exact shapes): the scale grid Expanded to the weight's
                     shape and Sliced, then one Mul.
    fp8_strata_bytes_first
                     an opset-17 variant of strata's form: the bytes
                     Reshaped into [SR, 128, SC, 128] first (one byte an
                     element), then Cast, Gather, Mul, one Reshape back.
    fp8_dql          opset 21 DequantizeLinear over a FLOAT8E4M3FN initializer
                     (the same bytes), axis=1, block_size=128. DQL blocks one
                     axis only, so the [SR, SC] grid is first repeated 128x
                     along the rows by nodes (Reshape [SR,1,SC], Expand
                     [SR,128,SC], Reshape [SR*128, SC]; a Slice to R would cut
                     a partial last row block). Default session options.
    fp8_dql_folded   the same model with session.disable_quant_qdq=1, the
                     documented switch that lets constant folding fold
                     DequantizeLinear (by default ORT keeps DQ nodes unfolded
                     for its QDQ fusions).
    fp8_cast         opset 19 Cast(FLOAT8E4M3FN -> FLOAT) replacing strata's
                     Gather decode; the blocked Mul as strata's.
    f32              the baseline: float32 initializers holding the
                     dequantised values (what --weights materialize writes).
  INT4 (compressed-tensors pack-quantized, symmetric, group 128 and group 32):
    int4_gN_strata      strata's form, opset 17: the int32 words Cast to int64,
                        Mod 2^32, Unsqueeze, Div by the 8 place values, Mod 16,
                        Sub 8, Reshape, Cast int32, Cast float, blocked Mul by
                        the bf16 scale Cast to float.
    int4_gN_strata_bytes
                        an opset-17 variant: the same bytes referenced as UINT8
                        [R, C/2], nibbles split by UINT8 Mod/Div 16, Concat,
                        Reshape, Cast float, Sub 8, blocked Mul.
    int4_gN_dql         opset 21 DequantizeLinear over a UINT4 [R, C]
                        initializer that references the SAME bytes as the int32
                        words (see below), zero point 8 of the scale's shape
                        built in the graph (Expand of a uint8 8, Cast to UINT4:
                        no weight bytes in the model), scale the bf16 scale
                        Cast to float, axis=1, block_size=N.
    int4_gN_dql_folded  the same with session.disable_quant_qdq=1.
    int4_gN_matmulnbits com.microsoft MatMulNBits (the operator QEfficient
                        exports AWQ/GPTQ weights as) over the same bytes read as
                        uint8 [out, in/N, N/2] blocks, scale the bf16 scale Cast
                        to float; no zero point (its default is 8). It replaces
                        the Gemm: the weight is never materialised in float.
  NVFP4 (ModelOpt: two E2M1 codes a byte + E4M3 per-16 scale + float32 scale_2):
    nvfp4_strata     strata's form (two Gathers from the 16-entry table,
                     Concat, Reshape; the E4M3 scale decoded by Gather and
                     multiplied by scale_2; blocked Mul). ONNX Runtime 1.32's
                     CPU provider implements neither DequantizeLinear nor Cast
                     for FLOAT4E2M1 (the script probes and records this), so
                     there is no native form to compare.

Why the int4 bytes are reinterpretable: compressed-tensors' pack_to_int32
adds 2^(bits-1) (8) to each signed code, then sums code_k << 4k over the 8
codes of a word along the last axis; on a little-endian file byte b of a word
holds codes 2b (low nibble) and 2b+1 (high nibble). ONNX packs UINT4 two per
byte, element 0 in the low nibble, over the row-major flattened tensor. So
the words' bytes ARE the UINT4 tensor [R, 8*words] of code+8, and
DequantizeLinear with zero point 8 gives (u - 8) * scale = q * scale. This
holds when the packed axis is the last one and C is a multiple of 8 (else
each row is padded to whole words: read [R, 8*words] and Slice the float
output). As INT4 (no zero point) the bytes would decode to ((q+8) xor 8)
reinterpreted, not q. The build step checks this byte equality.

Every measurement runs in a fresh process (`compare.py _run ...`): session
creation time (which includes ONNX Runtime's graph optimisation: constant
folding and pre-packing), the process's peak RSS (VmHWM of the child, which
starts fresh at exec), and the first and second inference. Three repetitions
by default, interleaved over the forms; min and median are reported. The
outputs of every form are compared bit for bit with strata's form of the same
family (and FP8 with the float32 baseline). A probe on k_proj alone records
the optimised graph's operator types (e.g. whether a DequantizeLinear stayed
or was fused into MatMulNBits).

Run (about 10 minutes on 2 cores; builds ~1.5 GB of data under --work):

    .venv/test/bin/python bench/dequant/compare.py [--runs 3] [--rows 16]
        [--work /tmp/strata-dequant-bench] [--json bench/dequant/results.json]
        [--forms fp8_strata,fp8_dql,...] [--merge]

Needs onnxruntime, onnx, numpy and ml_dtypes (the pinned test venv has all:
onnxruntime 1.32.0, onnx 1.23.2, numpy 2.4.6, ml_dtypes 0.7.0).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent

# The seven weights of a Llama-3.1-8B decoder layer: name, [out, in].
LAYER = (("q_proj", 4096, 4096), ("k_proj", 1024, 4096), ("v_proj", 1024, 4096),
         ("o_proj", 4096, 4096), ("gate_proj", 14336, 4096), ("up_proj", 14336, 4096),
         ("down_proj", 4096, 14336))
FP8_BLOCK = 128
NVFP4_GROUP = 16

# ------------------------------------------------------------------ data


def st_dtype(a: np.ndarray) -> str:
    import ml_dtypes
    return {np.dtype(np.float32): "F32", np.dtype(np.int32): "I32", np.dtype(np.uint8): "U8",
            np.dtype(ml_dtypes.bfloat16): "BF16", np.dtype(ml_dtypes.float8_e4m3fn): "F8_E4M3"}[a.dtype]


class SafetensorsWriter:
    """Writes a safetensors file tensor by tensor (the layout strata references:
    8-byte header length, JSON header, data) and records each tensor's absolute
    byte offset in the file, as strata's external_data entries give it."""

    def __init__(self, path: Path, specs: list[tuple[str, str, list[int], int]]):
        header, off = {}, 0
        for name, dt, shape, nbytes in specs:
            header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + nbytes]}
            off += nbytes
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        self.base = 8 + len(raw)
        self.header = header
        self.f = open(path, "wb")
        self.f.write(len(raw).to_bytes(8, "little") + raw)
        self.path = path

    def write(self, name: str, a: np.ndarray):
        start = self.header[name]["data_offsets"][0]
        assert self.f.tell() == self.base + start, name
        assert st_dtype(a) == self.header[name]["dtype"], name
        self.f.write(np.ascontiguousarray(a).tobytes())

    def offsets(self) -> dict:
        return {n: (self.base + h["data_offsets"][0], h["data_offsets"][1] - h["data_offsets"][0])
                for n, h in self.header.items()}

    def close(self):
        self.f.close()


def quant_fp8(w: np.ndarray):
    """FineGrainedFP8: per 128x128 block, scale_inv = amax / 448, codes E4M3."""
    import ml_dtypes
    r, c = w.shape
    b = w.reshape(r // FP8_BLOCK, FP8_BLOCK, c // FP8_BLOCK, FP8_BLOCK)
    scale = (np.abs(b).max(axis=(1, 3)) / np.float32(448.0)).astype(np.float32)
    q = (b / scale[:, None, :, None]).astype(ml_dtypes.float8_e4m3fn).reshape(r, c)
    deq = (q.astype(np.float32).reshape(b.shape) * scale[:, None, :, None]).reshape(r, c)
    return q, scale, deq


def pack_to_int32(q: np.ndarray) -> np.ndarray:
    """compressed-tensors' pack_to_int32 for 4 bits, packed_dim 1, literally:
    code + 8, then sum(code_k << 4k) over 8 codes a word."""
    u = (q.astype(np.int32) + 8).reshape(q.shape[0], -1, 8)
    shifts = np.arange(8, dtype=np.int32) * 4
    return (u << shifts).sum(axis=2, dtype=np.int64).astype(np.uint32).view(np.int32)


def quant_int4(w: np.ndarray, group: int):
    """compressed-tensors symmetric int4 per group: scale amax/7.5 stored as bf16."""
    import ml_dtypes
    r, c = w.shape
    g = w.reshape(r, c // group, group)
    scale = (np.abs(g).max(axis=2) / np.float32(7.5)).astype(ml_dtypes.bfloat16)
    s32 = scale.astype(np.float32)
    q = np.clip(np.rint(g / s32[:, :, None]), -8, 7).astype(np.int8).reshape(r, c)
    return pack_to_int32(q), scale, q


E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def quant_nvfp4(w: np.ndarray):
    """ModelOpt NVFP4: scale_2 = amax/(6*448); per 16, an E4M3 scale of
    amax_b/6/scale_2; codes the nearest E2M1 of w/(scale*scale_2)."""
    import ml_dtypes
    r, c = w.shape
    g = w.reshape(r, c // NVFP4_GROUP, NVFP4_GROUP)
    s2 = np.float32(np.abs(w).max() / (6 * 448))
    sb = (np.abs(g).max(axis=2) / 6 / s2).astype(ml_dtypes.float8_e4m3fn)
    eff = sb.astype(np.float32) * s2
    x = g / eff[:, :, None]
    mags = E2M1[:8]
    idx = np.abs(np.abs(x)[..., None] - mags).argmin(axis=-1).astype(np.uint8)
    codes = (idx | np.where(x < 0, 8, 0).astype(np.uint8)).reshape(r, c)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    return packed, sb, np.array([s2], np.float32)


def build_data(work: Path) -> dict:
    """Writes the checkpoint files once; returns the tensor index."""
    import ml_dtypes
    index_path = work / "index.json"
    if index_path.exists():
        return json.loads(index_path.read_text())
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    fams = {"fp8": [], "f32": [], "int4_g128": [], "int4_g32": [], "nvfp4": []}
    for name, r, c in LAYER:
        fams["fp8"] += [(f"{name}.weight", "F8_E4M3", [r, c], r * c),
                        (f"{name}.weight_scale_inv", "F32", [r // 128, c // 128], 4 * (r // 128) * (c // 128))]
        fams["f32"] += [(f"{name}.weight", "F32", [r, c], 4 * r * c)]
        for g in (128, 32):
            fams[f"int4_g{g}"] += [(f"{name}.weight_packed", "I32", [r, c // 8], r * c // 2),
                                   (f"{name}.weight_scale", "BF16", [r, c // g], 2 * r * c // g)]
        fams["nvfp4"] += [(f"{name}.weight", "U8", [r, c // 2], r * c // 2),
                          (f"{name}.weight_scale", "F8_E4M3", [r, c // 16], r * c // 16),
                          (f"{name}.weight_scale_2", "F32", [1], 4)]
    writers = {f: SafetensorsWriter(work / f"{f}.safetensors", s) for f, s in fams.items()}
    rng = np.random.default_rng(20240917)
    checks = {}
    for name, r, c in LAYER:
        w = (rng.standard_normal((r, c), dtype=np.float32) * np.float32(0.02))
        q, scale, deq = quant_fp8(w)
        writers["fp8"].write(f"{name}.weight", q)
        writers["fp8"].write(f"{name}.weight_scale_inv", scale)
        writers["f32"].write(f"{name}.weight", deq)
        del q, scale, deq
        for g in (128, 32):
            packed, s, codes = quant_int4(w, g)
            # The claim the DQL form rests on: the int32 words' bytes are the
            # ONNX UINT4 packing (low nibble first) of code + 8.
            u = (codes.astype(np.int16) + 8).astype(np.uint8)
            nib = (u[:, 0::2] | (u[:, 1::2] << 4)).astype(np.uint8)
            checks[f"{name} g{g} int32 words == UINT4 bytes"] = bool(np.array_equal(packed.view(np.uint8).reshape(r, -1), nib))
            writers[f"int4_g{g}"].write(f"{name}.weight_packed", packed)
            writers[f"int4_g{g}"].write(f"{name}.weight_scale", s)
            del packed, s, codes, u, nib
        packed, sb, s2 = quant_nvfp4(w)
        writers["nvfp4"].write(f"{name}.weight", packed)
        writers["nvfp4"].write(f"{name}.weight_scale", sb)
        writers["nvfp4"].write(f"{name}.weight_scale_2", s2)
        del w, packed, sb, s2
    index = {}
    for f, wr in writers.items():
        wr.close()
        index[f] = {"file": wr.path.name, "tensors": {n: [o, l] for n, (o, l) in wr.offsets().items()}}
    index["_checks"] = checks
    index["_build_s"] = round(time.perf_counter() - t0, 1)
    assert all(checks.values()), checks
    index_path.write_text(json.dumps(index, indent=1))
    return index


# ------------------------------------------------------------------ graphs


class G:
    """A graph under construction, named like strata's lowering (Op_N)."""

    def __init__(self, index: dict, family: str):
        self.nodes, self.inits, self.n = [], [], 0
        self.fam = index[family]

    def node(self, op, inputs, **attrs):
        from onnx import helper
        self.n += 1
        out = f"{op}_{self.n}"
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def const(self, arr: np.ndarray):
        from onnx import numpy_helper
        return self.node("Constant", [], value=numpy_helper.from_array(arr))

    def i64(self, *v):
        return self.const(np.array(v, np.int64))

    def reshape(self, x, shape):
        return self.node("Reshape", [x, self.i64(*shape)])

    def leaf(self, key, onnx_type, shape, name=None):
        """An external initializer over the checkpoint's bytes for key."""
        from onnx import TensorProto
        off, length = self.fam["tensors"][key]
        t = TensorProto(name=name or key, data_type=onnx_type, dims=shape)
        t.data_location = TensorProto.EXTERNAL
        for k, v in (("location", self.fam["file"]), ("offset", str(off)), ("length", str(length))):
            e = t.external_data.add()
            e.key, e.value = k, v
        self.inits.append(t)
        return t.name

    def model(self, outputs, opset, inputs):
        from onnx import TensorProto, helper
        graph = helper.make_graph(self.nodes, "dequant_bench",
                                  [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                                  [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
                                  initializer=self.inits)
        opsets = [helper.make_opsetid("", opset)]
        if any(n.domain == "com.microsoft" for n in self.nodes):
            opsets.append(helper.make_opsetid("com.microsoft", 1))
        m = helper.make_model(graph, opset_imports=opsets, producer_name="strata-dequant-bench")
        m.ir_version = 10
        return m


def fp8_table():
    import ml_dtypes
    return np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)


def w_fp8_strata(g: G, name, r, c, edge=False):
    from onnx import TensorProto as T
    sr, sc = r // FP8_BLOCK, c // FP8_BLOCK
    w = g.leaf(f"{name}.weight", T.UINT8, [r, c])
    s = g.leaf(f"{name}.weight_scale_inv", T.FLOAT, [sr, sc])
    q = g.node("Gather", [g.const(fp8_table()), g.node("Cast", [w], to=T.INT32)], axis=0)
    if not edge:
        blocked = g.reshape(q, [1, sr, FP8_BLOCK, sc, FP8_BLOCK])
        return g.reshape(g.node("Mul", [blocked, g.reshape(s, [1, sr, 1, sc, 1])]), [r, c])
    cells = g.reshape(s, [1, sr, 1, sc, 1])
    full = g.node("Expand", [cells, g.i64(1, sr, FP8_BLOCK, sc, FP8_BLOCK)])
    tiled = g.reshape(full, [1, sr * FP8_BLOCK, sc * FP8_BLOCK])
    cut = g.node("Slice", [tiled, g.i64(0, 0), g.i64(r, c), g.i64(1, 2)])
    return g.node("Mul", [q, g.reshape(cut, [r, c])])


def w_fp8_strata_bytes_first(g: G, name, r, c):
    """An opset-17 variant: the FP8 bytes reshaped into blocks while still one
    byte each, then Cast, Gather and Mul in the blocked shape, one Reshape
    back (one float32 copy fewer than fp8_strata)."""
    from onnx import TensorProto as T
    sr, sc = r // FP8_BLOCK, c // FP8_BLOCK
    w = g.leaf(f"{name}.weight", T.UINT8, [r, c])
    s = g.leaf(f"{name}.weight_scale_inv", T.FLOAT, [sr, sc])
    blocked = g.reshape(w, [sr, FP8_BLOCK, sc, FP8_BLOCK])
    q = g.node("Gather", [g.const(fp8_table()), g.node("Cast", [blocked], to=T.INT32)], axis=0)
    return g.reshape(g.node("Mul", [q, g.reshape(s, [sr, 1, sc, 1])]), [r, c])


def rows_expanded_scale(g: G, s, sr, sc, block, rows):
    """[SR, SC] -> [rows, SC]: each grid row repeated block times (cut to rows)."""
    x = g.node("Expand", [g.reshape(s, [sr, 1, sc]), g.i64(sr, block, sc)])
    x = g.reshape(x, [sr * block, sc])
    if sr * block != rows:
        x = g.node("Slice", [x, g.i64(0), g.i64(rows), g.i64(0)])
    return x


def w_fp8_dql(g: G, name, r, c):
    from onnx import TensorProto as T
    sr, sc = r // FP8_BLOCK, c // FP8_BLOCK
    w = g.leaf(f"{name}.weight", T.FLOAT8E4M3FN, [r, c])
    s = g.leaf(f"{name}.weight_scale_inv", T.FLOAT, [sr, sc])
    return g.node("DequantizeLinear", [w, rows_expanded_scale(g, s, sr, sc, FP8_BLOCK, r)], axis=1, block_size=FP8_BLOCK)


def w_fp8_cast(g: G, name, r, c):
    from onnx import TensorProto as T
    sr, sc = r // FP8_BLOCK, c // FP8_BLOCK
    w = g.leaf(f"{name}.weight", T.FLOAT8E4M3FN, [r, c])
    s = g.leaf(f"{name}.weight_scale_inv", T.FLOAT, [sr, sc])
    q = g.node("Cast", [w], to=T.FLOAT)
    blocked = g.reshape(q, [1, sr, FP8_BLOCK, sc, FP8_BLOCK])
    return g.reshape(g.node("Mul", [blocked, g.reshape(s, [1, sr, 1, sc, 1])]), [r, c])


def w_f32(g: G, name, r, c):
    from onnx import TensorProto as T
    return g.leaf(f"{name}.weight", T.FLOAT, [r, c])


def w_int4_strata(g: G, name, r, c, group):
    """unpack_int([4, 8], axis -1) then dequant([1, group]), as lower.go writes them."""
    from onnx import TensorProto as T
    words = c // 8
    p = g.leaf(f"{name}.weight_packed", T.INT32, [r, words])
    s = g.leaf(f"{name}.weight_scale", T.BFLOAT16, [r, c // group])
    x = g.node("Cast", [p], to=T.INT64)
    unsigned = g.node("Mod", [x, g.i64(1 << 32)])
    spread = g.node("Unsqueeze", [unsigned, g.i64(2)])
    places = g.reshape(g.i64(*[1 << (4 * k) for k in range(8)]), [8])
    shifted = g.node("Div", [spread, places])
    codes = g.node("Sub", [g.node("Mod", [shifted, g.i64(16)]), g.i64(8)])
    flat = g.reshape(codes, [r, c])
    q = g.node("Cast", [g.node("Cast", [flat], to=T.INT32)], to=T.FLOAT)
    scale = g.node("Cast", [s], to=T.FLOAT)
    blocked = g.reshape(q, [1, r, 1, c // group, group])
    return g.reshape(g.node("Mul", [blocked, g.reshape(scale, [1, r, 1, c // group, 1])]), [r, c])


def w_int4_strata_bytes(g: G, name, r, c, group):
    """An opset-17 variant: the int32 words referenced as UINT8 [R, C/2] (the
    same bytes), split into low and high nibbles with UINT8 Mod/Div (as
    strata's unpack_fp4 and QEfficient's CastToUInt4 do), then Cast float,
    Sub 8 and the blocked Mul: nothing wider than a byte before the float."""
    from onnx import TensorProto as T
    b = g.leaf(f"{name}.weight_packed", T.UINT8, [r, c // 2], name=f"{name}.weight_packed_as_bytes")
    s = g.leaf(f"{name}.weight_scale", T.BFLOAT16, [r, c // group])
    sixteen = g.const(np.array([16], np.uint8))
    low = g.node("Mod", [b, sixteen])
    high = g.node("Div", [b, sixteen])
    last = g.i64(-1)
    pairs = g.node("Concat", [g.node("Unsqueeze", [low, last]), g.node("Unsqueeze", [high, last])], axis=-1)
    codes = g.node("Cast", [g.reshape(pairs, [1, r, 1, c // group, group])], to=T.FLOAT)
    q = g.node("Sub", [codes, g.const(np.array([8], np.float32))])
    scale = g.reshape(g.node("Cast", [s], to=T.FLOAT), [1, r, 1, c // group, 1])
    return g.reshape(g.node("Mul", [q, scale]), [r, c])


def w_int4_dql(g: G, name, r, c, group):
    from onnx import TensorProto as T
    u = g.leaf(f"{name}.weight_packed", T.UINT4, [r, c], name=f"{name}.weight_packed_as_uint4")
    s = g.node("Cast", [g.leaf(f"{name}.weight_scale", T.BFLOAT16, [r, c // group])], to=T.FLOAT)
    # The zero point 8 built in the graph (Expand a uint8 8, Cast to UINT4),
    # so the model stays weight-free; ORT folds both nodes.
    zp = g.node("Cast", [g.node("Expand", [g.const(np.array([8], np.uint8)), g.i64(r, c // group)])], to=T.UINT4)
    return g.node("DequantizeLinear", [u, s, zp], axis=1, block_size=group)


def y_int4_matmulnbits(g: G, name, r, c, group, x):
    """com.microsoft MatMulNBits over the same bytes as [N, K/group, group/2]
    uint8 (codes low nibble first along K, as the words hold them); no zero
    point input: MatMulNBits' default for 4 bits is 8. This is the operator
    QEfficient exports AWQ/GPTQ weights as (QuantLinearORT)."""
    from onnx import TensorProto as T
    b = g.leaf(f"{name}.weight_packed", T.UINT8, [r, c // group, group // 2], name=f"{name}.weight_packed_as_blocks")
    s = g.node("Cast", [g.leaf(f"{name}.weight_scale", T.BFLOAT16, [r, c // group])], to=T.FLOAT)
    return g.node("MatMulNBits", [x, b, g.reshape(s, [r * (c // group)])], domain="com.microsoft",
                  K=c, N=r, bits=4, block_size=group)


def w_nvfp4_strata(g: G, name, r, c):
    """unpack_fp4 then dequant(codes, mul(scale, scale_2), [1, 16])."""
    from onnx import TensorProto as T
    p = g.leaf(f"{name}.weight", T.UINT8, [r, c // 2])
    sb = g.leaf(f"{name}.weight_scale", T.UINT8, [r, c // 16])
    s2 = g.leaf(f"{name}.weight_scale_2", T.FLOAT, [1])
    codes = g.node("Cast", [p], to=T.INT32)
    sixteen = g.const(np.array(16, np.int32))
    fp4 = g.const(E2M1)
    low = g.node("Gather", [fp4, g.node("Mod", [codes, sixteen])], axis=0)
    high = g.node("Gather", [fp4, g.node("Div", [codes, sixteen])], axis=0)
    last = g.i64(-1)
    pairs = g.node("Concat", [g.node("Unsqueeze", [low, last]), g.node("Unsqueeze", [high, last])], axis=-1)
    q = g.reshape(pairs, [r, c])
    scale = g.node("Gather", [g.const(fp8_table()), g.node("Cast", [sb], to=T.INT32)], axis=0)
    combined = g.node("Mul", [scale, g.reshape(s2, [1])])
    blocked = g.reshape(q, [1, r, 1, c // 16, 16])
    return g.reshape(g.node("Mul", [blocked, g.reshape(combined, [1, r, 1, c // 16, 1])]), [r, c])


# key: (family of data, reference form for bit comparison, weight builder, opset, session config)
FORMS = {
    "fp8_strata": ("fp8", None, lambda g, n, r, c: w_fp8_strata(g, n, r, c), 17, {}),
    "fp8_strata_edge": ("fp8", "fp8_strata", lambda g, n, r, c: w_fp8_strata(g, n, r, c, edge=True), 17, {}),
    "fp8_strata_bytes_first": ("fp8", "fp8_strata", w_fp8_strata_bytes_first, 17, {}),
    "fp8_dql": ("fp8", "fp8_strata", w_fp8_dql, 21, {}),
    "fp8_dql_folded": ("fp8", "fp8_strata", w_fp8_dql, 21, {"session.disable_quant_qdq": "1"}),
    "fp8_cast": ("fp8", "fp8_strata", w_fp8_cast, 19, {}),
    "f32": ("f32", "fp8_strata", w_f32, 17, {}),
    "int4_g128_strata": ("int4_g128", None, lambda g, n, r, c: w_int4_strata(g, n, r, c, 128), 17, {}),
    "int4_g128_strata_bytes": ("int4_g128", "int4_g128_strata", lambda g, n, r, c: w_int4_strata_bytes(g, n, r, c, 128), 17, {}),
    "int4_g128_dql": ("int4_g128", "int4_g128_strata", lambda g, n, r, c: w_int4_dql(g, n, r, c, 128), 21, {}),
    "int4_g128_dql_folded": ("int4_g128", "int4_g128_strata", lambda g, n, r, c: w_int4_dql(g, n, r, c, 128), 21,
                             {"session.disable_quant_qdq": "1"}),
    "int4_g128_matmulnbits": ("int4_g128", "int4_g128_strata", lambda g, n, r, c, x: y_int4_matmulnbits(g, n, r, c, 128, x),
                              21, {}),
    "int4_g32_strata": ("int4_g32", None, lambda g, n, r, c: w_int4_strata(g, n, r, c, 32), 17, {}),
    "int4_g32_strata_bytes": ("int4_g32", "int4_g32_strata", lambda g, n, r, c: w_int4_strata_bytes(g, n, r, c, 32), 17, {}),
    "int4_g32_dql": ("int4_g32", "int4_g32_strata", lambda g, n, r, c: w_int4_dql(g, n, r, c, 32), 21, {}),
    "int4_g32_dql_folded": ("int4_g32", "int4_g32_strata", lambda g, n, r, c: w_int4_dql(g, n, r, c, 32), 21,
                            {"session.disable_quant_qdq": "1"}),
    "int4_g32_matmulnbits": ("int4_g32", "int4_g32_strata", lambda g, n, r, c, x: y_int4_matmulnbits(g, n, r, c, 32, x),
                             21, {}),
    "nvfp4_strata": ("nvfp4", None, w_nvfp4_strata, 17, {}),
}


def build_model(index, key, layer=LAYER, weight_outputs=False):
    """The layer model of a form: every weight's dequantisation first (model
    level, as strata's export), then one Gemm(transB=1) per weight."""
    fam, _, make, opset, _ = FORMS[key]
    g = G(index, fam)
    if key.endswith("_matmulnbits"):  # the product itself: no dequantised weight
        if weight_outputs:
            return None
        weights = [(name, r, c, None) for name, r, c in layer]
        outputs = [make(g, name, r, c, "x" if c == 4096 else "h") for name, r, c in layer]
    else:
        weights = [(name, r, c, make(g, name, r, c)) for name, r, c in layer]
        outputs = []
    for name, r, c, w in weights:
        if w is None:
            continue
        if weight_outputs:
            outputs.append(w)
        else:
            outputs.append(g.node("Gemm", ["x" if c == 4096 else "h", w], transB=1))
    # Graph outputs are named after the weights.
    from onnx import helper
    named = []
    for (name, *_), o in zip(weights, outputs):
        g.nodes.append(helper.make_node("Identity", [o], [name], name=f"out_{name}"))
        named.append(name)
    inputs = [("x", ["rows", 4096])]
    if any(c != 4096 for _, _, c in layer):
        inputs.append(("h", ["rows", 14336]))
    if weight_outputs:
        inputs = []
    return g.model(named, opset, inputs)


# ------------------------------------------------------------------ children


def status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def child_run(model: str, config: str, rows: int, save: str) -> dict:
    """One measurement: a fresh process opens the model and runs it twice."""
    import resource

    import onnxruntime as ort
    rss0 = status_kib("VmRSS")
    load = open("/proc/loadavg").read().split()[0]

    def cpu():
        u = resource.getrusage(resource.RUSAGE_SELF)
        return u.ru_utime + u.ru_stime
    so = ort.SessionOptions()
    so.log_severity_level = 3
    for k, v in json.loads(config).items():
        so.add_session_config_entry(k, v)
    c0, t0 = cpu(), time.perf_counter()
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    t1, c1 = time.perf_counter(), cpu()
    hwm_create = status_kib("VmHWM")
    rng = np.random.default_rng(7)
    feeds = {i.name: rng.standard_normal((rows, i.shape[1]), dtype=np.float32) for i in sess.get_inputs()}
    t2 = time.perf_counter()
    out = sess.run(None, feeds)
    t3 = time.perf_counter()
    sess.run(None, feeds)
    t4 = time.perf_counter()
    rep = {"create_s": t1 - t0, "create_cpu_s": c1 - c0, "loadavg_1min": float(load), "first_run_s": t3 - t2, "second_run_s": t4 - t3,
           "rss_before_mib": rss0 / 1024, "peak_create_mib": hwm_create / 1024,
           "peak_mib": status_kib("VmHWM") / 1024, "rss_after_mib": status_kib("VmRSS") / 1024,
           "ort": ort.__version__}
    if save:
        np.savez(save, **{o.name: v for o, v in zip(sess.get_outputs(), out)})
    return rep


def child_probe(model: str, config: str, optimized: str, save: str) -> dict:
    """The optimised graph's operator types (small model, k_proj only), and
    the dequantised weight when the model outputs it."""
    import onnx
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    for k, v in json.loads(config).items():
        so.add_session_config_entry(k, v)
    rep = {}
    if optimized:
        so.optimized_model_filepath = optimized
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    if optimized:
        m = onnx.load(optimized, load_external_data=False)
        ops = {}
        for n in m.graph.node:
            k = n.op_type if not n.domain else f"{n.domain}.{n.op_type}"
            ops[k] = ops.get(k, 0) + 1
        rep["optimized_ops"] = ops
        for n in m.graph.node:
            if n.op_type == "MatMulNBits":
                rep["matmulnbits_attrs"] = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
    if save:
        feeds = {i.name: np.random.default_rng(7).standard_normal((16, i.shape[1]), dtype=np.float32)
                 for i in sess.get_inputs()}
        out = sess.run(None, feeds)
        np.savez(save, **{o.name: v for o, v in zip(sess.get_outputs(), out)})
    return rep


def child_capabilities() -> dict:
    """What this ONNX Runtime's CPU provider implements for the 4-bit float type."""
    import onnxruntime as ort
    from onnx import TensorProto as T, helper, numpy_helper
    rep = {}
    for op, opset in (("Cast", 23), ("DequantizeLinear", 23), ("Cast", 24), ("DequantizeLinear", 24)):
        x = helper.make_tensor("x", T.FLOAT4E2M1, [2, 32], vals=bytes(range(32)), raw=True)
        inits = [x]
        if op == "Cast":
            node = helper.make_node("Cast", ["x"], ["y"], to=T.FLOAT)
        else:
            inits.append(numpy_helper.from_array(np.ones((2, 2), np.float32), "s"))
            node = helper.make_node("DequantizeLinear", ["x", "s"], ["y"], axis=1, block_size=16)
        graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", T.FLOAT, None)], initializer=inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        m.ir_version = 11
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        try:
            ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {})
            rep[f"{op}-{opset} FLOAT4E2M1"] = "ok"
        except Exception as e:  # noqa: BLE001
            rep[f"{op}-{opset} FLOAT4E2M1"] = str(e).split(" : ")[-1][:120]
    return rep


def child(argv):
    step = argv[0]
    if step == "_run":
        rep = child_run(argv[1], argv[2], int(argv[3]), argv[4])
    elif step == "_probe":
        rep = child_probe(argv[1], argv[2], argv[3], argv[4])
    elif step == "_caps":
        rep = child_capabilities()
    elif step == "_build":
        rep = build_data(Path(argv[1]))
    print("RESULT " + json.dumps(rep))
    return 0


def spawn(args: list[str], timeout: float = 900) -> dict:
    p = subprocess.run([sys.executable, str(Path(__file__).resolve()), *args],
                       capture_output=True, text=True, timeout=timeout)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{args[0]} failed ({p.returncode}): {p.stderr[-2000:]}")


# ------------------------------------------------------------------ driver


def compare_outputs(a: Path, b: Path) -> dict:
    x, y = np.load(a), np.load(b)
    identical, worst = True, 0.0
    for k in x.files:
        if not np.array_equal(x[k].view(np.uint32), y[k].view(np.uint32)):
            identical = False
            worst = max(worst, float(np.abs(x[k].astype(np.float64) - y[k]).max() / max(np.abs(x[k]).max(), 1e-30)))
    return {"bit_identical": identical, "max_rel_diff": worst}


def main(argv) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--rows", type=int, default=16, help="input rows (tokens) of the Gemms")
    p.add_argument("--work", type=Path, default=Path("/tmp/strata-dequant-bench"))
    p.add_argument("--json", type=Path, default=HERE / "results.json")
    p.add_argument("--forms", default=",".join(FORMS))
    p.add_argument("--merge", action="store_true",
                   help="add the forms measured to an existing --json (their references' outputs are reused from --work)")
    a = p.parse_args(argv)
    forms = a.forms.split(",")
    import onnx

    t_start = time.perf_counter()
    index = spawn(["_build", str(a.work)], timeout=1800)
    print(f"data in {a.work} (built in {index.get('_build_s')} s)", flush=True)
    report = {"layer": LAYER, "rows": a.rows, "runs": a.runs, "forms": {}, "checks": index["_checks"]}
    if a.merge and a.json.exists():
        report = json.loads(a.json.read_text())
    report["capabilities"] = spawn(["_caps"])
    k_layer = [l for l in LAYER if l[0] == "k_proj"]
    for key in forms:
        path = a.work / f"{key}.onnx"
        onnx.save(build_model(index, key), path)
        onnx.save(build_model(index, key, k_layer), a.work / f"{key}.probe.onnx")
        wm = build_model(index, key, k_layer, weight_outputs=True)
        if wm is not None:
            onnx.save(wm, a.work / f"{key}.weight.onnx")
        report["forms"][key] = {"model_bytes": path.stat().st_size, "opset": FORMS[key][3],
                                "session_config": FORMS[key][4], "nodes": len(onnx.load(path, load_external_data=False).graph.node),
                                "runs": []}
    # Probes: optimised operator types and the dequantised k_proj weight.
    for key in forms:
        cfg = json.dumps(FORMS[key][4])
        f = report["forms"][key]
        f["probe"] = spawn(["_probe", str(a.work / f"{key}.probe.onnx"), cfg, str(a.work / f"{key}.probe.opt.onnx"), ""])
        if (a.work / f"{key}.weight.onnx").exists():
            spawn(["_probe", str(a.work / f"{key}.weight.onnx"), cfg, "", str(a.work / f"{key}.weight.npz")])
    # Timed runs, interleaved over the forms.
    for rep in range(a.runs):
        for key in forms:
            save = str(a.work / f"{key}.out.npz") if rep == 0 else ""
            r = spawn(["_run", str(a.work / f"{key}.onnx"), json.dumps(FORMS[key][4]), str(a.rows), save])
            report["forms"][key]["runs"].append(r)
            print(f"run {rep + 1} {key:22s} create {r['create_s']:7.2f} s  peak {r['peak_mib']:7.0f} MiB  "
                  f"cpu {r['create_cpu_s']:7.2f} s  load {r['loadavg_1min']:4.1f}  first {r['first_run_s']:6.3f} s  second {r['second_run_s']:6.3f} s", flush=True)
    for key in forms:
        f = report["forms"][key]
        for m in ("create_s", "create_cpu_s", "loadavg_1min", "peak_mib", "first_run_s", "second_run_s", "rss_after_mib", "peak_create_mib", "rss_before_mib"):
            vals = [r[m] for r in f["runs"]]
            f[m] = {"min": min(vals), "median": statistics.median(vals)}
        ref = FORMS[key][1]
        if ref and (a.work / f"{ref}.out.npz").exists():
            f["outputs_vs_" + ref] = compare_outputs(a.work / f"{ref}.out.npz", a.work / f"{key}.out.npz")
            if (a.work / f"{key}.weight.npz").exists():
                f["weight_vs_" + ref] = compare_outputs(a.work / f"{ref}.weight.npz", a.work / f"{key}.weight.npz")
    if (a.work / "f32.out.npz").exists():
        for key in forms:
            if FORMS[key][0] == "fp8":
                report["forms"][key]["outputs_vs_f32"] = compare_outputs(a.work / "f32.out.npz", a.work / f"{key}.out.npz")
    report["total_s"] = round(report.get("total_s", 0) * a.merge + time.perf_counter() - t_start, 1)
    report["ort"] = report["forms"][forms[0]]["runs"][0]["ort"]
    a.json.write_text(json.dumps(report, indent=1) + "\n")
    print_table(report)
    return 0


def print_table(report: dict) -> None:
    print(f"\nonnxruntime {report['ort']}, {report['runs']} runs, rows {report['rows']}: min / median")
    print("| form | opset | nodes | session creation (s) | creation CPU (s) | peak RSS (MiB) | first run (s) | second run (s) | optimised k_proj ops | bits vs reference |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for key in sorted(report["forms"], key=lambda k: list(FORMS).index(k) if k in FORMS else len(FORMS)):
        f = report["forms"][key]
        ops = ", ".join(f"{k}×{v}" for k, v in sorted(f["probe"].get("optimized_ops", {}).items()) if k not in ("Identity",))
        bits = [f"{k[11:] if k.startswith('outputs_vs_') else k}: {'identical' if v['bit_identical'] else 'rel ' + format(v['max_rel_diff'], '.1e')}"
                for k, v in f.items() if k.startswith("outputs_vs_")]
        fmt = lambda m, d: f"{f[m]['min']:.{d}f} / {f[m]['median']:.{d}f}"  # noqa: E731
        print(f"| {key} | {f['opset']} | {f['nodes']} | {fmt('create_s', 2)} | {fmt('create_cpu_s', 2)} | {fmt('peak_mib', 0)} | {fmt('first_run_s', 3)} | "
              f"{fmt('second_run_s', 3)} | {ops} | {'; '.join(bits) or '(reference)'} |")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1].startswith("_"):
        sys.exit(child(sys.argv[1:]))
    sys.exit(main(sys.argv[1:]))
