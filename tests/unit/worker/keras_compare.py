#!/usr/bin/env python3
"""Tessera's layers against Keras itself (tf_keras): models built in Keras,
saved with model.to_json(), given random weights, run through keras_fwd
(the executor) and through Keras: inference outputs, training-mode outputs
(batch statistics), the training loss with regularization, every
trainable variable's gradient, and the batch statistics BatchNormalization
feeds its moving averages (Keras's own update, undone).

Usage: keras_compare.py KERAS_FWD. Exits 77 when tf_keras is not
importable (it is not a dependency of the project: pip install tf_keras
numpy into a venv and run this with that interpreter, or set
TSR_KERAS_PYTHON for the meson test)."""
import json
import os
import subprocess
import sys
import tempfile
import zlib

try:
    import numpy as np
    import tensorflow as tf
    import tf_keras as keras
except Exception as e:  # noqa: BLE001 - any import failure means skip
    print(f"keras_compare: skipped, tf_keras is not importable ({e})")
    sys.exit(77)

L = keras.layers
fails = 0


SEED = int(os.environ.get("TSR_KERAS_SEED", "0"))


def check(what, a, b, tol, scale=0.0):
    """Relative error of a against b; a b near zero is measured against
    1e-3, or a hundredth of `scale` (for a gradient, the norm of every
    gradient of the model) when that is more. A gradient that is zero in exact arithmetic
    is float rounding on both sides, as large as the model's other
    gradients make it: the key bias of attention (softmax does not change
    when every key shifts alike), a bias that BatchNormalization's batch
    mean takes away."""
    global fails
    a = np.asarray(a, np.float64).ravel()
    b = np.asarray(b, np.float64).ravel()
    den = max(np.linalg.norm(b), 1e-3, 1e-2 * scale)
    err = np.linalg.norm(a - b) / den
    ok = err <= tol
    print(f"{what:60s} rel err {err:9.2e} (tol {tol:.0e}) {'ok' if ok else 'FAIL'}")
    if not ok:
        fails += 1


def wname(w, model=None):
    """tf_keras: "dense/kernel:0"; Keras 3: path "dense/kernel" (newer
    Keras 3 prefixes the model's name, which its to_json() never names)."""
    nm = getattr(w, "path", None) or w.name.split(":")[0]
    if model is not None and nm.startswith(model.name + "/"):
        nm = nm[len(model.name) + 1:]
    return nm


K = keras  # the Keras whose models run() is given


def run(name, model, x, y, fwd):
    # the weights of a case come from its name (hash() differs from one
    # process to the next); TSR_KERAS_SEED=N draws other weights, to look
    # further than the suite does
    rng = np.random.default_rng(zlib.crc32(name.encode()) ^ SEED)
    with tempfile.TemporaryDirectory() as d:
        mj = os.path.join(d, "model.json")
        with open(mj, "w") as f:
            f.write(model.to_json())
        loss_name = "sparse_categorical_crossentropy"
        out = subprocess.run([fwd, mj, loss_name, "--vars"], capture_output=True,
                             text=True)
        if out.returncode:
            print(f"{name}: keras_fwd refused the model: {out.stderr.strip()}")
            fails_add()
            return
        ours = [(l.split()[0], int(l.split()[1])) for l in out.stdout.splitlines()]
        kw = {wname(w, model): w for w in model.weights}
        # Keras 2 prefixes nothing; check every name maps
        vals = []
        for nm, numel in ours:
            w = kw.get(nm)
            if w is None:
                print(f"{name}: Keras has no variable {nm} (it has {sorted(kw)})")
                fails_add()
                return
            if "moving_variance" in nm:
                v = rng.uniform(0.5, 1.5, w.shape)
            elif "moving_mean" in nm:
                v = rng.normal(0, 0.3, w.shape)
            else:
                v = rng.normal(0, 0.4, w.shape)
            w.assign(v.astype(np.float32))
            assert int(np.prod(w.shape)) == numel, nm
            vals.append(w.numpy().astype(np.float32).ravel())
        np.concatenate(vals).tofile(os.path.join(d, "w.f32"))
        xs = x if isinstance(x, list) else [x]
        np.concatenate([a.reshape(len(a), -1) for a in xs], 1).astype(
            np.float32).tofile(os.path.join(d, "x.f32"))
        y.astype(np.float32).tofile(os.path.join(d, "y.f32"))
        n = len(y)
        r = subprocess.run([fwd, mj, loss_name, os.path.join(d, "w.f32"),
                            os.path.join(d, "x.f32"), os.path.join(d, "y.f32"),
                            str(n), os.path.join(d, "out.f32")],
                           capture_output=True, text=True)
        if r.returncode:
            print(f"{name}: keras_fwd failed: {r.stderr.strip()}")
            fails_add()
            return
        res = np.fromfile(os.path.join(d, "out.f32"), np.float32)
        ref = os.environ.get("TSR_KERAS_WRITE_REF")
        if ref and name in REF_CASES:
            ref = os.path.join(ref, REF_CASES[name])
            os.makedirs(ref, exist_ok=True)
            for f in ("model.json", "w.f32", "x.f32", "y.f32"):
                with open(os.path.join(d, f), "rb") as a, \
                        open(os.path.join(ref, f), "wb") as b:
                    b.write(a.read())
    od = model.output_shape[-1]
    ev, tr = res[:n * od], res[n * od:2 * n * od]
    loss, grads = res[2 * n * od], res[2 * n * od + 1:]
    check(f"{name}: inference outputs", ev, np.asarray(model(x, training=False)), 1e-5)
    before = {w.name: w.numpy().copy() for w in model.weights}
    with tf.GradientTape() as tape:
        out = model(x, training=True)
        kl = K.losses.SparseCategoricalCrossentropy()(y, out)
        if model.losses:
            kl = kl + tf.add_n(model.losses)
    g = tape.gradient(kl, model.trainable_weights)
    check(f"{name}: training-mode outputs", tr, np.asarray(out), 1e-5)
    check(f"{name}: training loss (with regularization)", [loss], [kl.numpy()], 1e-5)
    gi = {wname(w, model): gg for w, gg in zip(model.trainable_weights, g)}
    if ref and name in REF_CASES:  # Keras's figures, in keras_fwd's layout
        parts = [model(x, training=False).numpy().ravel(), out.numpy().ravel(),
                 np.array([kl.numpy()])]
        parts += [tf.convert_to_tensor(gi[nm]).numpy().ravel() for nm, _ in ours]
        np.concatenate(parts).astype(np.float32).tofile(
            os.path.join(ref, "expect.f32"))
        with open(os.path.join(ref, "n"), "w") as f:
            f.write(f"{n}\n")
    off = 0
    gscale = np.sqrt(sum(float(np.sum(np.square(tf.convert_to_tensor(v).numpy())))
                         for v in gi.values()))
    for nm, numel in ours:
        mine = grads[off:off + numel]
        off += numel
        if nm in gi:
            check(f"{name}: d loss / d {nm}", mine,
                  tf.convert_to_tensor(gi[nm]).numpy(), 2e-4, gscale)
            continue
        # a moving statistic: Keras updated it in the training call above
        w = kw[nm]
        layer = model.get_layer(nm.split("/")[0])
        m = layer.momentum
        old = before[w.name]
        batch = (w.numpy() - old * m) / (1 - m)
        # undoing the update divides the new value's rounding by 1 - m: a
        # batch statistic far below the old one is measured against that
        sc = float(np.linalg.norm(w.numpy())) / (1 - m)
        if "moving_mean" in nm:
            check(f"{name}: {nm} batch statistic", mine, batch, 1e-4, sc)
        else:
            rows = int(np.prod(layer.input_shape[1:-1]) or 1) * n
            biased = np.linalg.norm(mine - batch) / max(
                np.linalg.norm(batch), 1e-2 * sc)
            bessel = batch * (rows - 1) / rows
            unb = np.linalg.norm(mine - bessel) / max(
                np.linalg.norm(bessel), 1e-2 * sc)
            note = ("Keras uses the batch variance" if biased < 1e-4 else
                    f"Keras applies Bessel's correction ({rows}/{rows - 1}), "
                    "Tessera the batch variance as Keras 3 does" if unb < 1e-4
                    else "differs")
            print(f"{name + ': ' + nm + ' batch statistic':60s} {note}")
            if min(biased, unb) > 1e-4:
                fails_add()


def fails_add():
    global fails
    fails += 1


# The cases whose Keras figures are committed under tests/data/keras_seq
# (TSR_KERAS_WRITE_REF=DIR writes them), so the suite checks them without
# TensorFlow (keras_fwd --check).
REF_CASES = {"conv1d+pool1d": "conv1d", "lstm+gru masked": "lstm_gru",
             "bidirectional masked": "bidir", "bidirectional gru mul": "bidir_mul",
             "multi-head self-attention masked": "mha",
             "cross attention": "cross_attention"}


def ids(rng, n, steps, vocab, pad=True):
    """Token ids with padding (0) at the end of each row (at least one
    real token), as a tokenizer writes them."""
    x = rng.integers(1, vocab, (n, steps))
    if pad:
        for i in range(n):
            x[i, rng.integers(1, steps + 1):] = 0
    return x.astype(np.float32)


def seq_cases(fwd, rng, n, y, keras=keras, tag=""):
    """Conv1D, pooling, LSTM, GRU, Bidirectional, MultiHeadAttention,
    Attention and TimeDistributed, with Embedding(mask_zero) masks; with
    tag "keras3 " the same models as Keras 3 writes them."""
    global K
    K = keras
    L = keras.layers

    def run_(name, *a):
        run(tag + name, *a)

    m = keras.Sequential([
        keras.Input((10, 3)),
        L.Conv1D(4, 3, padding="same", activation="relu"),
        L.MaxPooling1D(2),
        L.Conv1D(3, 2, padding="causal", strides=2,
                 kernel_regularizer=keras.regularizers.L2(0.01)),
        L.AveragePooling1D(2, padding="same"),
        L.Conv1D(4, 1),
        L.GlobalMaxPooling1D(),
        L.Dense(5, activation="softmax"),
    ])
    run_("conv1d+pool1d", m, rng.normal(size=(n, 10, 3)).astype(np.float32), y, fwd)

    m = keras.Sequential([
        keras.Input((7,)),
        L.Embedding(12, 4, mask_zero=True),
        L.LSTM(5, return_sequences=True),
        L.Dropout(0.0),
        L.GRU(3),
        L.Dense(5, activation="softmax"),
    ])
    run_("lstm+gru masked", m, ids(rng, n, 7, 12), y, fwd)

    m = keras.Sequential([
        keras.Input((6,)),
        L.Embedding(10, 4, mask_zero=True),
        L.Bidirectional(L.LSTM(3, return_sequences=True)),
        L.Bidirectional(L.GRU(2, return_sequences=True), merge_mode="sum"),
        L.LSTM(3, go_backwards=True, return_sequences=True),
        L.GlobalAveragePooling1D(),
        L.Dense(5, activation="softmax"),
    ])
    run_("bidirectional masked", m, ids(rng, n, 6, 10), y, fwd)

    m = keras.Sequential([
        keras.Input((5, 3)),
        L.Bidirectional(L.GRU(2), merge_mode="mul"),
        L.Dense(5, activation="softmax"),
    ])
    run_("bidirectional gru mul", m, rng.normal(size=(n, 5, 3)).astype(np.float32), y, fwd)

    t = keras.Input((6,), name="tokens")
    e = L.Embedding(11, 8, mask_zero=True)(t)
    a = L.MultiHeadAttention(2, 3)(e, e)
    a = L.Add()([e, a])
    a = L.LayerNormalization()(a)
    a = L.TimeDistributed(L.Dense(4, activation="relu"))(a)
    a = L.GlobalAveragePooling1D()(a)
    out = L.Dense(5, activation="softmax")(a)
    run_("multi-head self-attention masked", keras.Model(t, out),
        ids(rng, n, 6, 11), y, fwd)

    q = keras.Input((4, 6), name="q")
    v = keras.Input((3, 5), name="v")
    kk = keras.Input((3, 6), name="k")
    a = L.MultiHeadAttention(3, 2, value_dim=4, output_shape=7)(q, v, kk)
    b = L.Attention(use_scale=True)([q, v, kk])
    c = L.Attention()([q, L.Dense(6)(v)])
    f = L.Concatenate()([L.Flatten()(a), L.Flatten()(b), L.Flatten()(c)])
    out = L.Dense(5, activation="softmax")(f)
    xs = [rng.normal(size=(n, 4, 6)).astype(np.float32),
          rng.normal(size=(n, 3, 5)).astype(np.float32),
          rng.normal(size=(n, 3, 6)).astype(np.float32)]
    run_("cross attention", keras.Model([q, v, kk], out), xs, y, fwd)


def main():
    fwd = sys.argv[1]
    tf.random.set_seed(1)
    rng = np.random.default_rng(5)
    n = 6
    y = rng.integers(0, 5, n).astype(np.float32)

    m = keras.Sequential([
        L.InputLayer(input_shape=(9, 7, 2)),
        L.Conv2D(4, 3, strides=2, padding="same", activation="relu",
                 kernel_regularizer=keras.regularizers.L2(0.01)),
        L.MaxPooling2D(3, strides=2, padding="same"),
        L.Conv2D(3, (2, 3), padding="same", use_bias=False,
                 bias_regularizer=keras.regularizers.L1(0.02)),
        L.BatchNormalization(),
        L.LeakyReLU(0.1),
        L.AveragePooling2D(2, padding="same"),
        L.Flatten(),
        L.Dense(5, activation="softmax"),
    ])
    run("cnn", m, rng.normal(size=(n, 9, 7, 2)).astype(np.float32), y, fwd)

    m = keras.Sequential([
        L.InputLayer(input_shape=(12,)),
        L.Dense(12, activation="tanh",
                kernel_regularizer=keras.regularizers.L1L2(0.01, 0.02)),
        L.Reshape((3, 4)),
        L.LayerNormalization(),
        L.Dense(6, activation="elu"),
        L.GlobalAveragePooling1D(),
        L.BatchNormalization(momentum=0.9, epsilon=0.01),
        L.ReLU(),
        L.Dense(5),
        L.Softmax(),
    ])
    run("reshape+layernorm+bn", m, rng.normal(size=(n, 12)).astype(np.float32), y, fwd)

    a = keras.Input((3,), name="a")
    b = keras.Input((4,), name="b")
    img = keras.Input((5, 5, 1), name="img")
    da = L.Dense(4, activation="relu")(a)
    db = L.Dense(4)(b)
    s = L.Add()([da, db, b])
    s = L.Subtract()([s, da])
    s = L.Average()([s, db])
    c = L.Conv2D(2, 3, padding="same", activation="relu")(img)
    c2 = L.Conv2D(2, 3, padding="same")(c)
    r = L.Add()([c, c2])
    r = L.Concatenate(axis=-1)([r, img])
    r = L.LayerNormalization(axis=[1, 2, 3])(r)
    gap = L.GlobalAveragePooling2D()(r)
    cat = L.Concatenate()([L.ELU(0.5)(s), gap, a])
    cat = L.BatchNormalization(center=False)(cat)
    out = L.Dense(5, activation="softmax")(cat)
    m = keras.Model([a, b, img], out)
    xs = [rng.normal(size=(n, 3)).astype(np.float32),
          rng.normal(size=(n, 4)).astype(np.float32),
          rng.normal(size=(n, 5, 5, 1)).astype(np.float32)]
    run("functional", m, xs, y, fwd)

    seq_cases(fwd, rng, n, y)
    try:
        import keras as keras3
        ok3 = keras3.__version__.startswith("3")
    except Exception:  # noqa: BLE001 - no Keras 3: its cases are skipped
        ok3 = False
    if ok3:
        seq_cases(fwd, rng, n, y, keras3, "keras3 ")
    else:
        print("keras_compare: Keras 3 is not importable, its cases skipped")
    print(f"keras_compare: {fails} failure(s)")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
