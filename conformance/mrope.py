"""position_ids for a Qwen3-VL model.onnx exported with vision inputs
(strata export ... --vision true): [4, batch, seq], int64.

Row 0 is each token's sequence position: 0, 1, 2, ... from the start of the
sequence (it writes and reads the KV cache and builds the causal mask),
-1 for padding. Rows 1..3 are multimodal RoPE's temporal, height and width
positions, which transformers computes in Qwen3VLModel.get_rope_index:

- a text token takes p on all three rows, and the next token p + 1 (the
  first token: p = 0);
- an image of grid (t, h, w) patches (image_grid_thw) fills t * h' * w'
  image tokens, h' = h / m, w' = w / m (m = vision_config.spatial_merge_size),
  in row-major (frame, row, column) order: the token of frame i, row j,
  column k takes (p + i, p + j, p + k); the text after it starts at
  p + max(h', w');
- every later token of the sequence (decode) takes its sequence position
  plus the sequence's delta on the three rows, delta = (largest prefill
  position + 1) - prompt length.

Images are consumed in image_grid_thw order, row-major over the batch,
which is also the order of vision.onnx's rows.
"""

import numpy as np


def prefill(input_ids, lengths, image_grid_thw, image_token_id, spatial_merge_size):
    """position_ids [4, batch, seq] for right-padded prompts input_ids
    [batch, seq] of lengths [batch] (the image token standing once per
    vision row), and each sequence's delta [batch] for decode()."""
    batch, width = input_ids.shape
    pos = np.full((4, batch, width), -1, dtype=np.int64)
    grids = iter(np.asarray(image_grid_thw).reshape(-1, 3))
    deltas = np.zeros(batch, dtype=np.int64)
    for b in range(batch):
        n = int(lengths[b])
        pos[0, b, :n] = np.arange(n)
        ids, s, nxt = input_ids[b], 0, 0
        while s < n:
            if ids[s] != image_token_id:
                pos[1:, b, s] = nxt
                s, nxt = s + 1, nxt + 1
                continue
            t, h, w = (int(x) for x in next(grids))
            h, w = h // spatial_merge_size, w // spatial_merge_size
            i, j, k = np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij")
            count = t * h * w
            if s + count > n or np.any(ids[s : s + count] != image_token_id):
                raise ValueError(f"sequence {b}: the image at {s} needs {count} image tokens in a row")
            pos[1:, b, s : s + count] = nxt + np.stack([i.ravel(), j.ravel(), k.ravel()])
            s, nxt = s + count, nxt + max(h, w)
        deltas[b] = pos[1:, b, :n].max() + 1 - n
    return pos, deltas


def decode(positions, deltas):
    """position_ids [4, batch, len] for tokens at sequence positions
    [batch, len] (-1: padding) of sequences whose prefill gave deltas."""
    positions = np.asarray(positions, dtype=np.int64)
    rows = np.where(positions >= 0, positions + np.asarray(deltas)[:, None], -1)
    return np.stack([positions, rows, rows, rows]).astype(np.int64)
