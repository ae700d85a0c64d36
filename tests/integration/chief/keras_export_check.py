"""Reads back what `tessera ckpt export` wrote and checks it against
Tessera's own evaluation (run by test_export_keras*.sh; the sequence
layers' forward pass and sub-layer paths are in keras_seq_ref.py).

    keras_export_check.py numpy OUT MODEL CSV LABEL LOSS WANT
    keras_export_check.py keras OUT MODEL CSV LABEL LOSS WANT

OUT holds w.npz, input_stats.json, m.keras, w.weights.h5 and w.h5; MODEL
is the job's Keras model JSON (or a job file with the model inline); the
CSV's rows i % 5 == 4 are the job's
eval split; LOSS is mse or sparse_categorical_crossentropy; WANT the eval
loss Tessera reported.

numpy (numpy and h5py only): a float64 forward pass of the model JSON
written from Keras's layer definitions reproduces WANT from the npz and
input_stats.json; the npz is in get_weights order (model.layers order);
the .keras archive's config and model.weights.h5, the .weights.h5 and
tf_keras's legacy .h5 hold the npz's arrays at Keras's paths (a
sub-layer's below its layer, tf_keras's name of a MultiHeadAttention's
too) and shapes (Attention's scale a scalar).

keras: whichever of keras (Keras 3) and tf_keras imports: load_model on
the .keras predicts on raw inputs what the numpy pass predicts, its
get_weights() is the npz in order, and the model JSON loaded with
load_weights from the .weights.h5 and the .h5 predicts the same. Then
Keras writes the weights itself into OUT/keras/ (Keras 3: k3.keras,
k3.weights.h5, k3.npz from np.savez(*get_weights()); tf_keras: tfk.h5,
tfk.weights.h5) for the shell to start Tessera from; tf_keras's part is
skipped for a model JSON Keras 3 wrote. Exits 77 when neither imports.
"""
import io
import json
import os
import re
import sys
import zipfile

try:
    import numpy as np
except ImportError:
    print(f"no numpy in {sys.executable}: the Keras part is skipped")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import keras_seq_ref  # noqa: E402  (the sequence layers)

mode, out, model_path, csv, label, loss, want = sys.argv[1:8]
want = float(want)
model = json.load(open(model_path))
model = model.get("model", model) if isinstance(model.get("model"), dict) else model


def snake(cls):
    s = re.sub("(.)([A-Z][a-z]+)", r"\1_\2", cls)
    return re.sub("([a-z])([A-Z])", r"\1_\2", s).lower()


# unnamed Sequential layers get Keras's default names ("dense", "dense_1")
if model["class_name"] == "Sequential":
    model["config"].setdefault("name", "sequential")  # tf_keras needs one
    count = {}
    for L in model["config"]["layers"]:
        base = snake(L["class_name"])
        k = count.get(base, 0)
        count[base] = k + 1
        L["config"].setdefault("name", base if k == 0 else f"{base}_{k}")
z = np.load(f"{out}/w.npz")
# no input_stats.json: the job reads its inputs as they are (token ids)
has_stats = os.path.exists(f"{out}/input_stats.json")
st = json.load(open(f"{out}/input_stats.json")) if has_stats else {"scale": 1.0, "shift": 0.0}

# ---- data: the eval split, raw and as training read it ---------------------
head = open(csv).readline().strip().split(",")
d = np.loadtxt(csv, delimiter=",", skiprows=1)
ev = d[np.arange(len(d)) % 5 == 4]
y = ev[:, head.index(label)]
raw = np.delete(ev, head.index(label), axis=1)
scaled = raw * np.array(st["scale"]) + np.array(st["shift"])


def cfg_of(layer):
    return layer["config"]


def batch_shape(c):
    return c.get("batch_input_shape") or c.get("batch_shape")


def feed(arrays):
    """What predict takes: one array, or a list for several inputs."""
    arrays = [a.astype("float32") for a in arrays]
    return arrays[0] if len(arrays) == 1 else arrays


def io_names(v):
    """input_layers / output_layers: [[name, 0, 0], ...], or Keras 3's
    [name, 0, 0] for one."""
    return [v[0]] if isinstance(v[0], str) else [r[0] for r in v]


def inputs_of(m):
    """(name, shape) of each model input, in the model's input order."""
    c = m["config"]
    if m["class_name"] == "Sequential":
        for L in c["layers"]:
            s = batch_shape(L["config"])
            if s:
                return [(L["config"].get("name", "input"), s[1:])]
    by = {L["name"]: L for L in c["layers"]}
    return [(n, batch_shape(by[n]["config"])[1:]) for n in io_names(c["input_layers"])]


def split_inputs(x, cols):
    """Each input's columns of the dense features, in its shape."""
    xs = []
    for (name, shape), first in zip(inputs_of(model), cols):
        size = int(np.prod(shape))
        xs.append(x[:, first:first + size].reshape((-1, *shape)))
    return xs


def columns():
    """Each input's first column: input_stats.json's columns (by input
    name; a Sequential's one input whatever its name), else in order."""
    got = st.get("columns", {})
    cols, off = [], 0
    for name, shape in inputs_of(model):
        c = got.get(name)
        if c is None and model["class_name"] == "Sequential" and len(got) == 1:
            c = next(iter(got.values()))
        cols.append(off if c is None else c)
        off += int(np.prod(shape))
    return cols


# ---- a float64 forward pass from Keras's layer definitions ----------------
def act(name, x, alpha=None):
    if isinstance(name, dict):
        name = name["config"] if isinstance(name.get("config"), str) else name["class_name"]
    name = name or "linear"
    if name == "linear":
        return x
    if name == "relu":
        return np.maximum(x, 0)
    if name == "softmax":
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)
    if name == "sigmoid":
        return 1 / (1 + np.exp(-x))
    if name == "tanh":
        return np.tanh(x)
    if name == "elu":
        return np.where(x > 0, x, (1.0 if alpha is None else alpha) * np.expm1(x))
    if name == "leaky_relu":
        return np.where(x > 0, x, (0.2 if alpha is None else alpha) * x)
    raise NotImplementedError(f"activation {name}")


def pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def pad_same(x, k, s, value):
    """TF's 'same' padding of an NHWC batch for a window k, stride s."""
    pads = [(0, 0)]
    for ax in (1, 2):
        n = x.shape[ax]
        total = max((-(-n // s[ax - 1]) - 1) * s[ax - 1] + k[ax - 1] - n, 0)
        pads.append((total // 2, total - total // 2))
    pads.append((0, 0))
    return np.pad(x, pads, constant_values=value)


def windows(x, k, s):
    w = np.lib.stride_tricks.sliding_window_view(x, k, axis=(1, 2))
    return w[:, ::s[0], ::s[1]]  # [n, oh, ow, c, kh, kw]


def norm_axes(c, rank):
    a = c.get("axis", -1)
    a = a if isinstance(a, list) else [a]
    return tuple(sorted(i % rank for i in a))


def layer_fwd(cls, c, x, W, name, kw=None, mask=None):
    g = lambda k: W[f"{name}/{k}"]
    has = lambda k: f"{name}/{k}" in W
    y = keras_seq_ref.forward(cls, c, x, W, name, kw or {}, act, mask)
    if y is not None:
        return y
    if cls == "Dense":
        h = x @ g("kernel") + (g("bias") if has("bias") else 0)
        return act(c.get("activation"), h)
    if cls == "Conv2D":
        k, s = pair(c["kernel_size"]), pair(c.get("strides", 1))
        if c.get("padding", "valid") == "same":
            x = pad_same(x, k, s, 0.0)
        w = windows(x, k, s)
        h = np.einsum("nhwcij,ijco->nhwo", w, g("kernel"))
        return act(c.get("activation"), h + (g("bias") if has("bias") else 0))
    if cls in ("MaxPooling2D", "AveragePooling2D"):
        k = pair(c.get("pool_size", 2))
        s = pair(c.get("strides") or k)
        same = c.get("padding", "valid") == "same"
        if cls == "MaxPooling2D":
            xp = pad_same(x, k, s, -np.inf) if same else x
            return windows(xp, k, s).max(axis=(-2, -1))
        ones = np.ones(x.shape[:3] + (1,))
        xp = pad_same(x, k, s, 0.0) if same else x
        cnt = pad_same(ones, k, s, 0.0) if same else ones
        return windows(xp, k, s).sum(axis=(-2, -1)) / windows(cnt, k, s).sum(axis=(-2, -1))
    if cls.startswith("GlobalAveragePooling"):
        return x.mean(axis=tuple(range(1, x.ndim - 1)), keepdims=bool(c.get("keepdims")))
    if cls == "Flatten":
        return x.reshape(len(x), -1)
    if cls == "Reshape":
        return x.reshape((len(x), *c["target_shape"]))
    if cls == "BatchNormalization":
        h = (x - g("moving_mean")) / np.sqrt(g("moving_variance") + c.get("epsilon", 1e-3))
        return h * (g("gamma") if has("gamma") else 1) + (g("beta") if has("beta") else 0)
    if cls == "LayerNormalization":
        ax = norm_axes(c, x.ndim)
        mu = x.mean(axis=ax, keepdims=True)
        var = x.var(axis=ax, keepdims=True)
        h = (x - mu) / np.sqrt(var + c.get("epsilon", 1e-3))
        return h * (g("gamma") if has("gamma") else 1) + (g("beta") if has("beta") else 0)
    if cls == "Activation":
        return act(c["activation"], x)
    if cls == "ReLU":
        h = np.where(x > 0, x, (c.get("negative_slope") or 0) * x)
        return np.minimum(h, c["max_value"]) if c.get("max_value") is not None else h
    if cls == "LeakyReLU":
        return act("leaky_relu", x, c.get("negative_slope", c.get("alpha", 0.3)))
    if cls == "ELU":
        return act("elu", x, c.get("alpha", 1.0))
    if cls == "Softmax":
        return act("softmax", x)
    if cls == "Dropout":
        return x
    if cls == "Add":
        return sum(x)
    if cls == "Subtract":
        return x[0] - x[1]
    if cls == "Average":
        return sum(x) / len(x)
    if cls == "Concatenate":
        return np.concatenate(x, axis=c.get("axis", -1))
    raise NotImplementedError(f"layer class {cls}")


def call_refs(L):
    """(positional layer names, {keyword: layer name}) of a Functional
    layer's call, Keras 2 and 3 forms (tf_keras passes a
    MultiHeadAttention's value by keyword); a mask argument left out."""
    pos, kwargs, kw = [], {}, {}

    def names(j, out):
        if isinstance(j, dict):
            if j.get("class_name") == "__keras_tensor__":
                out.append(j["config"]["keras_history"][0])
        elif isinstance(j, list):
            if len(j) >= 3 and isinstance(j[0], str) and isinstance(j[1], int):
                out.append(j[0])
            else:
                for e in j:
                    names(e, out)

    node = L["inbound_nodes"][0]
    if isinstance(node, dict):
        names(node.get("args", []), pos)
        kwargs = node.get("kwargs", {})
    else:
        for r in node:
            pos.append(r[0])
            kwargs.update(r[3] if len(r) > 3 else {})
    for k in sorted(kwargs):
        got = []
        if k != "mask":
            names(kwargs[k], got)
        if got:
            kw[k] = got[0]
    return pos, kw


def inbound(L):
    """The layer names a Functional layer reads, as Keras flattens a call:
    the positional ones, then the keyword ones by key."""
    pos, kw = call_refs(L)
    return pos + [kw[k] for k in sorted(kw)]


def forward(W, xs):
    c = model["config"]
    if model["class_name"] == "Sequential":
        x, mask = xs[0], None
        for L in c["layers"]:
            if L["class_name"] != "InputLayer":
                y = layer_fwd(L["class_name"], L["config"], x, W, L["config"]["name"],
                              mask=mask)
                mask = keras_seq_ref.out_mask(L["class_name"], L["config"], x, mask)
                x = y
        return x
    vals = {n: x for n, x in zip(io_names(c["input_layers"]), xs)}
    pending = [L for L in c["layers"] if L["class_name"] != "InputLayer"]
    while pending:
        L = next(L for L in pending if all(n in vals for n in inbound(L)))
        pending.remove(L)
        pos, kw = call_refs(L)
        ins = [vals[n] for n in pos]
        vals[L["name"]] = layer_fwd(L["class_name"], L["config"],
                                    ins if len(ins) > 1 else ins[0], W, L["name"],
                                    {k: vals[n] for k, n in kw.items()})
    return vals[io_names(c["output_layers"])[0]]


def loss_of(p):
    if loss == "mse":
        return float(np.mean((p[:, 0] - y) ** 2))
    return float(np.mean(-np.log(np.maximum(p[np.arange(len(y)), y.astype(int)], 1e-7))))


def keras_layer_order():
    """model.layers as Keras orders it: (name, class) of each layer."""
    c = model["config"]
    if model["class_name"] == "Sequential":
        return [(L["config"]["name"], L["class_name"]) for L in c["layers"]
                if L["class_name"] != "InputLayer"]
    by = {L["name"]: L for L in c["layers"]}
    idx, post, done = {}, [], set()

    def walk(n):
        if n in done:
            return
        idx.setdefault(n, len(idx))
        if by[n]["class_name"] != "InputLayer":
            for m in inbound(by[n]):
                walk(m)
        done.add(n)
        post.append(n)

    walk(io_names(c["output_layers"])[0])
    depth = {}
    for n in reversed(post):
        depth.setdefault(n, 0)
        if by[n]["class_name"] != "InputLayer":
            for m in inbound(by[n]):
                depth[m] = max(depth.get(m, 0), depth[n] + 1)
    order = sorted(post, key=lambda n: (-depth[n], idx[n]))
    return [(n, by[n]["class_name"]) for n in order]


def expected_layout():
    """[(layer name, saving path, [npz keys], [(key, Keras 3 sub-path,
    tf_keras's, index, scalar)])] in model.layers order."""
    seen, rows = {}, []
    for name, cls in keras_layer_order():
        base = snake(cls)
        k = seen.get(base, -1) + 1
        seen[base] = k
        keys = [f for f in z.files if f.startswith(name + "/")]
        rows.append((name, base if k == 0 else f"{base}_{k}", keys,
                     keras_seq_ref.placed(cls, name, keys)))
    return rows


def vars_path(path, sub, i):
    return f"layers/{path}/{sub}/vars/{i}" if sub else f"layers/{path}/vars/{i}"


xs = split_inputs(scaled, columns())
W = {k: z[k].astype(np.float64) for k in z.files}
pred = forward(W, xs)

if mode == "numpy":
    import h5py
    got = loss_of(pred)
    assert abs(got - want) <= 1e-4 * abs(want), f"numpy eval loss {got} != Tessera's {want}"
    layout = expected_layout()
    order = [k for _, _, keys, _ in layout for k in keys]
    assert z.files == order, f"npz not in get_weights order: {z.files} != {order}"
    zf = zipfile.ZipFile(f"{out}/m.keras")
    assert sorted(zf.namelist()) == ["config.json", "metadata.json", "model.weights.h5"]
    cfg = json.loads(zf.read("config.json"))
    classes = [L["class_name"] for L in cfg["config"]["layers"]]
    assert classes.count("Normalization") == (len(inputs_of(model)) if has_stats else 0), classes
    f3 = h5py.File(io.BytesIO(zf.read("model.weights.h5")), "r")
    fw = h5py.File(f"{out}/w.weights.h5", "r")
    fl = h5py.File(f"{out}/w.h5", "r")
    names = [n.decode() if isinstance(n, bytes) else n for n in fl.attrs["layer_names"]]
    assert names == [n for n, _, _, _ in layout], (names, layout)
    n_vars = 0
    for name, path, keys, places in layout:
        wn = [n.decode() if isinstance(n, bytes) else n
              for n in fl[name].attrs["weight_names"]] if len(fl[name].attrs["weight_names"]) else []
        assert wn == [k + ":0" for k in keys], (name, wn, keys)
        for k, sub, alt, i, scalar in places:
            assert z[k].shape == () if scalar else z[k].ndim > 0, (k, z[k].shape)
            for f in (f3, fw):
                for p in {vars_path(path, sub, i), vars_path(path, alt, i)}:
                    assert np.array_equal(f[p][()], z[k]) and f[p].shape == z[k].shape, (p, k)
            assert np.array_equal(fl[f"{name}/{k}:0"][()], z[k]) and fl[f"{name}/{k}:0"].shape == z[k].shape, k
            n_vars += 1
    assert n_vars == len(z.files), (n_vars, z.files)
    print(f"numpy: eval loss {got:.6f} from the npz and input_stats.json (Tessera's "
          f"{want:.6f}); npz in get_weights order; .keras, .weights.h5 and .h5 hold "
          f"it at Keras's paths ({len(layout)} layers)")
    sys.exit(0)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
checked = []
try:
    import keras
except Exception:
    keras = None
if keras is not None and keras.__version__.startswith("3"):
    m = keras.models.load_model(f"{out}/m.keras")
    raws = split_inputs(raw, columns())
    p = np.asarray(m.predict(feed(raws), verbose=0))
    assert np.allclose(p, pred, rtol=1e-3, atol=1e-4), np.max(abs(p - pred))
    got = [np.asarray(w) for w in m.get_weights()]
    assert len(got) == len(z.files) and all(
        np.array_equal(a, z[k]) for a, k in zip(got, z.files)), "get_weights differs from the npz"
    for wf in ("w.weights.h5", "w.h5"):
        m2 = keras.models.load_model(f"{out}/m.keras")
        for v in m2.weights:
            v.assign(np.zeros(v.shape, v.dtype))
        m2.load_weights(f"{out}/{wf}")
        p2 = np.asarray(m2.predict(feed(raws), verbose=0))
        assert np.allclose(p2, p, rtol=1e-5, atol=1e-6), (wf, np.max(abs(p2 - p)))
    os.makedirs(f"{out}/keras", exist_ok=True)
    m.save(f"{out}/keras/k3.keras")
    m.save_weights(f"{out}/keras/k3.weights.h5")
    np.savez(f"{out}/keras/k3.npz", *m.get_weights())
    checked.append(f"keras {keras.__version__}: load_model predicts on raw inputs what "
                   f"Tessera's weights predict (max diff {np.max(abs(p - pred)):.2e}), "
                   "get_weights is the npz, load_weights reads the .weights.h5 and the .h5")
try:
    import tf_keras
except Exception:
    tf_keras = None
# tf_keras reads only its own JSON (Keras 3's dtype policies and
# __keras_tensor__ calls are beyond it)
raw_json = open(model_path).read()
if tf_keras is not None and ("DTypePolicy" in raw_json or "__keras_tensor__" in raw_json):
    checked.append("tf_keras: the model is Keras 3's JSON, which model_from_json "
                   "cannot read; its part is skipped")
elif tf_keras is not None:
    for wf in ("w.weights.h5", "w.h5"):
        m = tf_keras.models.model_from_json(json.dumps(model))
        m.load_weights(f"{out}/{wf}")
        p = np.asarray(m.predict(feed(xs), verbose=0))
        assert np.allclose(p, pred, rtol=1e-3, atol=1e-4), (wf, np.max(abs(p - pred)))
        got = m.get_weights()
        assert all(np.array_equal(a, z[k]) for a, k in zip(got, z.files)), wf
    os.makedirs(f"{out}/keras", exist_ok=True)
    m.save_weights(f"{out}/keras/tfk.h5")
    m.save_weights(f"{out}/keras/tfk.weights.h5")
    checked.append(f"tf_keras {tf_keras.__version__}: model_from_json + load_weights of the "
                   ".weights.h5 and the .h5 predict the same; get_weights is the npz")
if checked:
    checked.append("Keras wrote " + ", ".join(sorted(os.listdir(f"{out}/keras"))))
if not checked:
    print("neither keras 3 nor tf_keras imports: Keras part skipped")
    sys.exit(77)
print("\n".join(checked))
