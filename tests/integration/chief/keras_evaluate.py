#!/usr/bin/env python3
"""`tessera evaluate` and `tessera predict` against Keras's own evaluate()
and predict() on the same weights and data (run by the meson test
keras_evaluate with the Keras interpreter of tests/keras_python.sh).

  keras_evaluate.py BUILD_DIR JOB.json [JOB.json ...]

For each job (CSV data with the "every k" eval split; its model JSON):
tf_keras builds the model with model_from_json, gets seeded random
weights (BatchNormalization moving statistics away from 0 and 1, so
inference mode is what is checked) and saves them as a legacy .h5 and a
.weights.h5; Keras evaluates (loss and the job's metric) and predicts on
the eval split prepared as worker/INPUT.md says (scale, normalize with the
training rows' statistics, inputs placed by feature name). Then, from each
file: `tessera evaluate` gives Keras's loss and metric, `tessera predict`
Keras's outputs, `tessera evaluate --data train` Keras's figures on the
training rows, `tessera-worker --standalone --evaluate` tessera's own
figures exactly, and no weights file changes. Exits 77 when tf_keras does
not import, 1 naming the job, the file and the figure that differ.
"""
import hashlib
import json
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tf_keras as keras
except Exception as e:  # noqa: BLE001 - any import failure means skip
    print(f"keras_evaluate: skipped, tf_keras is not importable ({e})")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench", "keras"))
import keras_reference as ref  # noqa: E402  (the parity benchmark's reader)

fails = 0


def check(what, ok, detail):
    global fails
    print(f"{what:64s} {detail} {'ok' if ok else 'FAIL'}")
    if not ok:
        fails += 1


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def run(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{' '.join(cmd)}: exit {out.returncode}\n"
                         f"{out.stderr.strip()}")
    return out


def figures(path):
    return json.load(open(path))["eval"]


def main(argv):
    build, jobs = argv[1], argv[2:]
    tessera = os.path.join(build, "chief", "tessera")
    worker = os.path.join(build, "worker", "tessera-worker")
    for job_path in jobs:
        name = os.path.basename(job_path)
        job_dir = os.path.dirname(os.path.abspath(job_path))
        job = json.load(open(job_path))
        model_json = open(ref.job_path(job_dir, job["model"])).read()
        train, ev = job["data"]["train"], job["data"]["eval"]
        regression = job["loss"] in ("mse", "mae")
        xtr, ytr, xev, yev, names = ref.load_csv(job_dir, train, ev,
                                                 regression)
        metric = job["metrics"][0]
        keras.utils.set_random_seed(7)
        model = keras.models.model_from_json(model_json)
        model.compile(loss=job["loss"], metrics=job["metrics"])
        rng = np.random.default_rng(7)
        ws = []
        for w in model.weights:
            nm = w.name
            if "moving_variance" in nm:
                v = rng.uniform(0.5, 1.5, w.shape)
            elif "moving_mean" in nm:
                v = rng.normal(0, 0.3, w.shape)
            elif "gamma" in nm:
                v = rng.uniform(0.6, 1.4, w.shape)
            else:
                v = rng.normal(0, 0.3, w.shape)
            ws.append(v.astype(np.float32))
        model.set_weights(ws)
        bs = int(job["batch_size"])
        x_ev = ref.split_inputs(model, xev, names)
        x_tr = ref.split_inputs(model, xtr, names)
        k_ev = model.evaluate(x_ev, yev, batch_size=bs, verbose=0,
                              return_dict=True)
        k_tr = model.evaluate(x_tr, ytr, batch_size=bs, verbose=0,
                              return_dict=True)
        k_pred = np.asarray(model.predict(x_ev, batch_size=bs, verbose=0))
        with tempfile.TemporaryDirectory() as d:
            files = [os.path.join(d, "w.h5"), os.path.join(d, "w.weights.h5")]
            for f in files:
                model.save_weights(f)
            first = None
            for f in files:
                base = os.path.basename(f)
                before = sha(f)
                s = os.path.join(d, "s.json")
                run([tessera, "evaluate", "--job", job_path, "--weights", f,
                     "--summary-json", s])
                got = figures(s)
                tol = 1e-5 * max(1.0, abs(k_ev["loss"]))
                check(f"{name} {base}: evaluate loss",
                      abs(got["loss"] - k_ev["loss"]) <= tol,
                      f"tessera {got['loss']:.6f} keras {k_ev['loss']:.6f}")
                # accuracy may differ by a near tie at most; mae as the loss
                mtol = 1.0 / len(yev) + 1e-9 if metric == "accuracy" \
                    else 1e-5 * max(1.0, abs(k_ev[metric]))
                check(f"{name} {base}: evaluate {metric}",
                      abs(got[metric] - k_ev[metric]) <= mtol,
                      f"tessera {got[metric]:.6f} keras {k_ev[metric]:.6f}")
                run([tessera, "evaluate", "--job", job_path, "--weights", f,
                     "--data", "train", "--summary-json", s])
                gt = figures(s)
                check(f"{name} {base}: evaluate --data train loss",
                      abs(gt["loss"] - k_tr["loss"]) <=
                      1e-5 * max(1.0, abs(k_tr["loss"])),
                      f"tessera {gt['loss']:.6f} keras {k_tr['loss']:.6f}")
                p = os.path.join(d, "p.npy")
                run([tessera, "predict", "--job", job_path, "--weights", f,
                     "--out", p])
                pred = np.load(p)
                err = float(np.max(np.abs(pred - k_pred))) \
                    if pred.shape == k_pred.shape else float("inf")
                scale = float(np.max(np.abs(k_pred)))
                check(f"{name} {base}: predict {pred.shape}",
                      err <= 1e-5 * max(1.0, scale),
                      f"max diff {err:.2e} (keras {k_pred.shape})")
                sw = os.path.join(d, "w.json")
                run([worker, "--standalone", "--evaluate", "--job", job_path,
                     "--weights", f, "--device", "cpu", "--summary-json", sw])
                gw = figures(sw)
                check(f"{name} {base}: the standalone trainer's figures",
                      gw == got, f"{gw['loss']:.6f}")
                check(f"{name} {base}: the weights file unchanged",
                      sha(f) == before, "sha256")
                if first is None:
                    first = got
                check(f"{name} {base}: the same figures as from w.h5",
                      got == first, "")
    if fails:
        print(f"{fails} check(s) failed")
        return 1
    print(f"tf_keras {keras.__version__}: tessera evaluate and predict give "
          "Keras's figures and outputs")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
