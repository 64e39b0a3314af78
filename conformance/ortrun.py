"""Runs a strata export under ONNX Runtime the way a serving loop does: a
padded prefill, then one token per step, feeding each step's retained KV
cache back as the next step's past."""

import numpy as np
import onnxruntime as ort

ORT_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64}


def session(model_path):
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(model_path, opts, providers=["CPUExecutionProvider"])


# Cache inputs: the KV cache, linear attention's states, and latent
# attention's (MLA) compressed_kv and k_pe (each with its _RetainedState
# output).
CACHE_PREFIXES = ("past_", "conv_state.", "recurrent_state.", "compressed_kv.", "k_pe.")


def is_cache(name):
    return name.startswith(CACHE_PREFIXES)


def empty_caches(sess, batch, ctx_len):
    """Zero caches for every cache input, shaped from the model's declared
    shape ([batch_size, heads, ctx_len, head_dim] for the KV cache)."""
    caches = {}
    for i in sess.get_inputs():
        if is_cache(i.name):
            dims = [batch if d in ("batch_size", "full_batch_size") else ctx_len if d == "ctx_len" else d for d in i.shape]
            caches[i.name] = np.zeros(dims, dtype=ORT_TYPES[i.type])
    return caches


def prefill_positions(lengths, width):
    """position_ids for right-padded prompts: 0..n-1, then -1 for padding."""
    ar = np.arange(width, dtype=np.int64)[None, :]
    return np.where(ar < np.asarray(lengths)[:, None], ar, -1).astype(np.int64)


def step(sess, input_ids, position_ids, caches, extra=None):
    """One step; extra holds further graph inputs by name (vision_embeds)."""
    if hasattr(sess, "step"):  # Windows, or another runner of several models
        return sess.step(input_ids, position_ids, caches, **({"extra": extra} if extra else {}))
    names = [o.name for o in sess.get_outputs()]
    feeds = {"input_ids": input_ids, "position_ids": position_ids, **caches, **(extra or {})}
    outs = dict(zip(names, sess.run(names, feeds)))
    retained = {k[: -len("_RetainedState")]: v for k, v in outs.items() if k.endswith("_RetainedState")}
    return outs["logits"], retained


def run_steps(sess, prompts, lengths, decode_tokens, ctx_len):
    """run, for any object with get_inputs() and step()."""
    return run(sess, prompts, lengths, decode_tokens, ctx_len)


def run(sess, prompts, lengths, decode_tokens, ctx_len):
    """Logits [1 + steps, batch, vocab]: the prefill's last valid token, then
    each decode step's."""
    batch = prompts.shape[0]
    caches = empty_caches(sess, batch, ctx_len)
    logits, caches = step(sess, prompts, prefill_positions(lengths, prompts.shape[1]), caches)
    out = [logits[:, 0, :]]
    for s in range(decode_tokens.shape[1]):
        ids = decode_tokens[:, s : s + 1].astype(np.int64)
        pos = (np.asarray(lengths) + s)[:, None].astype(np.int64)
        logits, caches = step(sess, ids, pos, caches)
        out.append(logits[:, 0, :])
    return np.stack(out).astype(np.float32)


def greedy(sess, prompts, lengths, n, ctx_len):
    """n greedy tokens per sequence."""
    batch = prompts.shape[0]
    caches = empty_caches(sess, batch, ctx_len)
    logits, caches = step(sess, prompts, prefill_positions(lengths, prompts.shape[1]), caches)
    tokens = [logits[:, 0, :].argmax(-1)]
    for s in range(n - 1):
        pos = (np.asarray(lengths) + s)[:, None].astype(np.int64)
        logits, caches = step(sess, tokens[-1][:, None].astype(np.int64), pos, caches)
        tokens.append(logits[:, 0, :].argmax(-1))
    return np.stack(tokens, axis=1)


class Windows:
    """The window models of a layerwise export, run one after another like
    one model: each window's hidden_states_out feeds the next window's
    hidden_states; position_ids go to every window; each window has its own
    layers' caches."""

    def __init__(self, window_paths):
        self.sessions = [session(p) for p in window_paths]

    def get_inputs(self):
        return [i for s in self.sessions for i in s.get_inputs() if is_cache(i.name)]

    def step(self, input_ids, position_ids, caches, extra=None):
        """extra: further graph inputs by name, fed to the windows that
        declare them (so is input_ids, an input of later windows too when
        the model has vision inputs)."""
        hidden, retained = None, {}
        for s in self.sessions:
            names = [o.name for o in s.get_outputs()]
            declared = {i.name for i in s.get_inputs()}
            feeds = {i.name: caches[i.name] for i in s.get_inputs() if is_cache(i.name)}
            feeds["position_ids"] = position_ids
            feeds.update({k: v for k, v in {"input_ids": input_ids, **(extra or {})}.items() if k in declared})
            if hidden is not None:
                feeds["hidden_states"] = hidden
            outs = dict(zip(names, s.run(names, feeds)))
            hidden = outs.get("hidden_states_out")
            retained.update({k[: -len("_RetainedState")]: v for k, v in outs.items() if k.endswith("_RetainedState")})
        return outs["logits"], retained
