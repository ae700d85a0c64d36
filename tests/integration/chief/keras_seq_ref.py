"""The sequence layers for keras_export_check.py, from Keras's layer
definitions: a float64 forward pass of Conv1D, the 1-D poolings, LSTM,
GRU (reset_after), Bidirectional, MultiHeadAttention, Attention and
TimeDistributed(Dense), and where Keras keeps their variables (the
sub-layer below the layer's saving path; tf_keras's own spelling of it).
numpy only. Masks as Keras applies them from an Embedding with
mask_zero: an RNN carries its state over a masked step (a sequence it
returns has zeros there when zero_output_for_mask, as a Bidirectional
forces; the step before's output otherwise).
"""
import numpy as np


def sig(x):
    return 1 / (1 + np.exp(-x))


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def one(v):
    return v[0] if isinstance(v, (list, tuple)) else v


def pad_1d(x, k, s, padding, value):
    n = x.shape[1]
    if padding == "causal":
        return np.pad(x, ((0, 0), (k - 1, 0), (0, 0)), constant_values=value)
    if padding != "same":
        return x
    total = max((-(-n // s) - 1) * s + k - n, 0)
    return np.pad(x, ((0, 0), (total // 2, total - total // 2), (0, 0)),
                  constant_values=value)


def windows_1d(x, k, s):
    w = np.lib.stride_tricks.sliding_window_view(x, k, axis=1)
    return w[:, ::s]  # [n, steps, c, k]


def rnn(cls, x, K, U, b, ret_seq, backwards, mask=None, zero_out=False):
    """Keras's LSTM (gates i, f, c, o) or GRU (z, r, h; reset_after, bias
    [input; recurrent]) over x [n, steps, f], from step 0 or the last;
    mask [n, steps] (True: a real step) or None."""
    n, steps, _ = x.shape
    u = U.shape[0]
    h = np.zeros((n, u))
    c = np.zeros((n, u))
    out = np.zeros((n, u))
    outs = []
    for t in (range(steps - 1, -1, -1) if backwards else range(steps)):
        if cls == "LSTM":
            z = x[:, t] @ K + h @ U + (0 if b is None else b)
            i, f, g, o = (z[:, j * u:(j + 1) * u] for j in range(4))
            c2 = sig(f) * c + sig(i) * np.tanh(g)
            h2 = sig(o) * np.tanh(c2)
        else:
            xz = x[:, t] @ K + (0 if b is None else b[0])
            hz = h @ U + (0 if b is None else b[1])
            z = sig(xz[:, :u] + hz[:, :u])
            r = sig(xz[:, u:2 * u] + hz[:, u:2 * u])
            hh = np.tanh(xz[:, 2 * u:] + r * hz[:, 2 * u:])
            h2, c2 = z * h + (1 - z) * hh, c
        m = np.ones((n, 1), bool) if mask is None else mask[:, t:t + 1]
        h, c = np.where(m, h2, h), np.where(m, c2, c)
        out = np.where(m, h2, 0 if zero_out else out)
        outs.append(out)
    return np.stack(outs, axis=1) if ret_seq else h


def cell_weights(W, prefix):
    """kernel, recurrent_kernel, bias (or None) of the cell under prefix."""
    keys = [k for k in W if k.startswith(prefix + "/")]
    get = lambda s: next((W[k] for k in keys if k.endswith("/" + s)), None)
    return get("kernel"), get("recurrent_kernel"), get("bias")


def sublayers(W, name):
    """The second name components under name/, in order (a
    Bidirectional's forward layer, then its backward one)."""
    seen = []
    for k in W:
        if k.startswith(name + "/"):
            s = k.split("/")[1]
            if s not in seen:
                seen.append(s)
    return seen


def out_mask(cls, c, x, mask):
    """The mask a layer's output carries: an Embedding with mask_zero makes
    one, an RNN that returns one step drops it, the rest pass it on."""
    if cls == "Embedding":
        return (x != 0) if c.get("mask_zero") else None
    seq = c["layer"]["config"] if cls == "Bidirectional" else c
    if cls in ("LSTM", "GRU", "Bidirectional") and not seq.get("return_sequences"):
        return None
    return mask


def forward(cls, c, x, W, name, kw, act, mask=None):
    """The layer's output, or None when cls is not a sequence layer; x is
    the positional input (a list for Attention), kw the tensors passed by
    keyword (a MultiHeadAttention's value and key), mask the input's (an
    RNN's; the models here have no mask reaching attention)."""
    g = lambda k: W[f"{name}/{k}"]
    has = lambda k: f"{name}/{k}" in W
    if cls == "Embedding":
        return g("embeddings")[x.astype(int)]
    if cls == "Conv1D":
        k, s = one(c["kernel_size"]), one(c.get("strides", 1))
        x = pad_1d(x, k, s, c.get("padding", "valid"), 0.0)
        h = np.einsum("ntck,kco->nto", windows_1d(x, k, s), g("kernel"))
        return act(c.get("activation"), h + (g("bias") if has("bias") else 0))
    if cls in ("MaxPooling1D", "AveragePooling1D"):
        k = one(c.get("pool_size", 2))
        s = one(c.get("strides") or k)
        same = c.get("padding", "valid")
        if cls == "MaxPooling1D":
            return windows_1d(pad_1d(x, k, s, same, -np.inf), k, s).max(axis=-1)
        cnt = pad_1d(np.ones(x.shape[:2] + (1,)), k, s, same, 0.0)
        return (windows_1d(pad_1d(x, k, s, same, 0.0), k, s).sum(axis=-1) /
                windows_1d(cnt, k, s).sum(axis=-1))
    if cls == "GlobalMaxPooling1D":
        return x.max(axis=1, keepdims=bool(c.get("keepdims")))
    if cls in ("LSTM", "GRU"):
        K, U, b = cell_weights(W, name)
        back = bool(c.get("go_backwards"))
        return rnn(cls, x, K, U, b, bool(c.get("return_sequences")), back, mask,
                   bool(c.get("zero_output_for_mask")))
    if cls == "Bidirectional":
        inner = c["layer"]
        ret = bool(inner["config"].get("return_sequences"))
        fw, bw = sublayers(W, name)
        f = rnn(inner["class_name"], x, *cell_weights(W, f"{name}/{fw}"), ret, False,
                mask, ret)
        b = rnn(inner["class_name"], x, *cell_weights(W, f"{name}/{bw}"), ret, True,
                mask, ret)
        if ret:
            b = b[:, ::-1]
        mode = c.get("merge_mode", "concat")
        if mode == "concat":
            return np.concatenate([f, b], axis=-1)
        return {"sum": f + b, "ave": (f + b) / 2, "mul": f * b}[mode]
    if cls == "MultiHeadAttention":
        xs = x if isinstance(x, list) else [x]
        q_in = xs[0]
        v_in = kw.get("value", xs[1] if len(xs) > 1 else None)
        k_in = kw.get("key", xs[2] if len(xs) > 2 else v_in)
        proj = lambda t, s: np.einsum("btf,fhk->bthk", t, g(f"{s}/kernel")) + (
            g(f"{s}/bias") if has(f"{s}/bias") else 0)
        q, k, v = proj(q_in, "query"), proj(k_in, "key"), proj(v_in, "value")
        q = q / np.sqrt(float(c["key_dim"]))
        a = softmax(np.einsum("bshk,bthk->bhts", k, q))
        o = np.einsum("bhts,bshv->bthv", a, v)
        return np.einsum("bthv,hvo->bto", o, g("attention_output/kernel")) + (
            g("attention_output/bias") if has("attention_output/bias") else 0)
    if cls == "Attention":
        q, v = x[0], x[1]
        k = x[2] if len(x) > 2 else v
        s = np.einsum("btf,bsf->bts", q, k)
        if c.get("use_scale"):
            s = s * g("scale")
        return np.einsum("bts,bsf->btf", softmax(s), v)
    if cls == "TimeDistributed":
        inner = c["layer"]["config"]
        kern = next(W[k] for k in W if k.startswith(name + "/") and k.endswith("kernel"))
        bias = [W[k] for k in W if k.startswith(name + "/") and k.endswith("bias")]
        return act(inner.get("activation"), x @ kern + (bias[0] if bias else 0))
    return None


MHA_SUBS = {"query": "query_dense", "key": "key_dense", "value": "value_dense",
            "attention_output": "output_dense"}


def placed(cls, name, keys):
    """[(npz key, Keras 3 sub-path, tf_keras's sub-path, index, Keras's
    shape is a scalar)] of one layer's variables: the sub-layer Keras
    keeps each in ("" for the layer's own), numbered per sub-layer."""
    rows, count = [], {}
    first = None
    for key in keys:
        rest = key[len(name) + 1:]
        comp = rest.split("/")[0]
        sub, alt, scalar = "", None, False
        if cls in ("LSTM", "GRU"):
            sub = "cell"
        elif cls == "Bidirectional":
            first = first or comp
            sub = "forward_layer/cell" if comp == first else "backward_layer/cell"
        elif cls == "MultiHeadAttention":
            sub = MHA_SUBS[comp]
            alt = "_" + sub
        elif cls == "TimeDistributed":
            sub = "layer"
        elif cls == "Attention" and rest == "scale":
            scalar = True
        i = count.get(sub, 0)
        count[sub] = i + 1
        rows.append((key, sub, alt or sub, i, scalar))
    return rows
