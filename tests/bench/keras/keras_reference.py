#!/usr/bin/env python3
"""Train a shipped job in Keras itself, seed by seed, for the parity table.

  keras_reference.py JOB.json SEED [SEED...] [--epochs N]

Reads the same files the job names (IDX gzip, or CSV with the job's
"every k" eval split, label column, scale and normalize as worker/INPUT.md
defines them), builds the model from the job's Keras JSON with
model_from_json, compiles it with the job's optimizer, loss, metrics and
batch size, fits for the job's epochs (Keras shuffles every epoch) and
prints one line per seed:

  SEED <n> <metric> <value> loss <value>

where the metric is the job's first metric on the eval split (accuracy,
or mae for regression) and loss the eval loss. Needs tf_keras (or Keras 3)
and numpy: run it with an interpreter that has them, e.g.
TSR_KERAS_PYTHON. Exits 77 when neither Keras is importable, 2 on a job it
cannot mirror (a format or key it does not know), naming it.
"""
import csv
import gzip
import json
import os
import struct
import sys


def fail(msg):
    print(f"keras_reference: {msg}", file=sys.stderr)
    sys.exit(2)


def load_keras():
    try:
        import tf_keras as keras  # noqa: F401
        return keras
    except ImportError:
        pass
    try:
        import keras  # noqa: F401
        return keras
    except ImportError:
        print("keras_reference: neither tf_keras nor keras is importable",
              file=sys.stderr)
        sys.exit(77)


def read_idx(path):
    import numpy as np
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 8:
        fail(f"{path}: not an unsigned-byte IDX file")
    ndim = data[3]
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    arr = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    return arr.reshape(dims)


def job_path(job_dir, p):
    return p if os.path.isabs(p) else os.path.normpath(os.path.join(job_dir, p))


def load_idx(job_dir, train, ev):
    import numpy as np
    scale = float(train.get("scale", 1.0))
    xtr = read_idx(job_path(job_dir, train["paths"])).astype(np.float32) * scale
    ytr = read_idx(job_path(job_dir, train["labels"])).astype(np.int64)
    if "paths" not in ev or "labels" not in ev:
        fail("idx jobs need data.eval.paths and data.eval.labels")
    xev = read_idx(job_path(job_dir, ev["paths"])).astype(np.float32) * scale
    yev = read_idx(job_path(job_dir, ev["labels"])).astype(np.int64)
    return xtr, ytr, xev, yev


def load_csv(job_dir, train, ev, regression):
    import numpy as np
    path = job_path(job_dir, train["paths"])
    label = train.get("label")
    if label is None:
        fail(f"{path}: the job names no label column")
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header, body = rows[0], rows[1:]
    if label not in header:
        fail(f"{path}: label column '{label}' not in header")
    li = header.index(label)
    feats = [i for i in range(len(header)) if i != li]
    x = np.array([[float(r[i]) for i in feats] for r in body], dtype=np.float64)
    y = np.array([float(r[li]) for r in body])
    y = y.astype(np.float32) if regression else y.astype(np.int64)
    x *= float(train.get("scale", 1.0))
    if ev.get("split") != "every":
        fail("csv jobs: only data.eval.split \"every\" is mirrored")
    k, idx = int(ev["k"]), int(ev["index"])
    is_ev = np.arange(len(body)) % k == idx
    xtr, ytr, xev, yev = x[~is_ev], y[~is_ev], x[is_ev], y[is_ev]
    if train.get("normalize"):
        mean = xtr.mean(axis=0)
        std = xtr.std(axis=0)  # population, as Normalization.adapt
        std[std == 0] = 1.0
        xtr = (xtr - mean) / std
        xev = (xev - mean) / std
    names = [header[i] for i in feats]
    return (xtr.astype(np.float32), ytr, xev.astype(np.float32), yev, names)


def split_inputs(model, x, names):
    """The model's inputs from the dense features: one input takes them
    all (reshaped); several take, each in input_layers order, the columns
    from the feature they are named after (else the next ones in order)."""
    shapes = [tuple(t.shape[1:]) for t in model.inputs]
    if len(shapes) == 1:
        return x.reshape((-1,) + shapes[0])
    out, at = [], 0
    for t, shape in zip(model.inputs, shapes):
        width = 1
        for d in shape:
            width *= int(d)
        base = t.name.split(":")[0].split("/")[0]
        if names and base in names:
            at = names.index(base)
        out.append(x[:, at:at + width].reshape((-1,) + shape))
        at += width
    return out


def optimizer(keras, spec):
    if isinstance(spec, str):
        return keras.optimizers.get(spec)
    spec = dict(spec)
    name = spec.pop("name")
    return keras.optimizers.get({"class_name": name, "config": spec})


def main(argv):
    args = [a for a in argv[1:]]
    epochs_override = None
    if "--epochs" in args:
        i = args.index("--epochs")
        epochs_override = int(args[i + 1])
        del args[i:i + 2]
    if len(args) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    keras = load_keras()
    job_file, seeds = args[0], [int(s) for s in args[1:]]
    job_dir = os.path.dirname(os.path.abspath(job_file))
    with open(job_file) as f:
        job = json.load(f)
    with open(job_path(job_dir, job["model"])) as f:
        model_json = f.read()
    train, ev = job["data"]["train"], job["data"].get("eval", {})
    loss = job["loss"]
    regression = loss in ("mse", "mae", "huber", "mean_squared_error")
    fmt = train.get("format", "csv")
    if fmt == "idx":
        xtr, ytr, xev, yev = load_idx(job_dir, train, ev)
        names = None
    elif fmt == "csv":
        xtr, ytr, xev, yev, names = load_csv(job_dir, train, ev, regression)
    else:
        fail(f"data.train.format '{fmt}' is not mirrored")
    metrics = job.get("metrics", [])
    epochs = epochs_override or int(job["epochs"])
    for seed in seeds:
        keras.utils.set_random_seed(seed)
        model = keras.models.model_from_json(model_json)
        model.compile(optimizer=optimizer(keras, job["optimizer"]), loss=loss,
                      metrics=metrics)
        model.fit(split_inputs(model, xtr, names), ytr,
                  batch_size=int(job["batch_size"]), epochs=epochs,
                  shuffle=True, verbose=0)
        out = model.evaluate(split_inputs(model, xev, names), yev,
                             verbose=0, return_dict=True)
        name = metrics[0] if metrics else "loss"
        print(f"SEED {seed} {name} {out.get(name, float('nan')):.4f} "
              f"loss {out['loss']:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
