#!/usr/bin/env python3
"""Training speed against Keras's own fit, same job, same threads, same run.

  bench_cnn_fit.py TESSERA_WORKER JOB.json THREADS [--pairs N] [--steps S]

One process per thread count (TensorFlow's thread pools are sized once):
TensorFlow is told THREADS intra-op and THREADS inter-op threads, the
model is built from the job's Keras JSON and compiled with its optimizer,
loss and batch; then, PAIRS times in turn, Keras fits S + 1 batches (the
first, which traces the graph, is not timed) and tessera-worker
--standalone --threads THREADS trains S steps of the same job. Each side's
examples/s is its training loop's (Keras: from the end of the first batch
to the end of the last; Tessera: its summary line, every step counted), so
startup and evaluation are left out on both sides. Prints one line per
pair with both rates and their CPU seconds, then

  RATIO cnn_fmnist_vs_keras_fit_<THREADS>t <median of tessera / keras>
        goal 1.0

Needs tf_keras (or Keras 3) and numpy: exits 77 when neither imports.
"""
import os
import re
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def arg(args, name, default):
    if name in args:
        i = args.index(name)
        v = args[i + 1]
        del args[i:i + 2]
        return int(v)
    return default


def main(argv):
    args = argv[1:]
    pairs = arg(args, "--pairs", 3)
    steps = arg(args, "--steps", 100)
    if len(args) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    worker, job_file, threads = args[0], args[1], int(args[2])
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        import tensorflow as tf
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    except ImportError:
        pass
    import keras_reference as kr
    keras = kr.load_keras()  # exits 77 without Keras
    import json
    job_dir = os.path.dirname(os.path.abspath(job_file))
    with open(job_file) as f:
        job = json.load(f)
    with open(kr.job_path(job_dir, job["model"])) as f:
        model_json = f.read()
    train = job["data"]["train"]
    if train.get("format") != "idx":
        kr.fail("bench_cnn_fit mirrors IDX jobs only")
    batch = int(job["batch_size"])
    xtr, ytr, _, _ = kr.load_idx(job_dir, train, job["data"].get("eval", {}))
    n = (steps + 1) * batch
    keras.utils.set_random_seed(1)
    model = keras.models.model_from_json(model_json)
    model.compile(optimizer=kr.optimizer(keras, job["optimizer"]),
                  loss=job["loss"], metrics=job.get("metrics", []))
    x = kr.split_inputs(model, xtr[:n], None)
    y = ytr[:n]

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, b, logs=None):
            if b == 0:
                self.t0, self.c0 = time.perf_counter(), time.process_time()
            self.t1, self.c1, self.last = (time.perf_counter(),
                                           time.process_time(), b)

    def keras_run():
        clk = Clock()
        model.fit(x, y, batch_size=batch, epochs=1, shuffle=True, verbose=0,
                  callbacks=[clk])
        ex = clk.last * batch
        return ex / (clk.t1 - clk.t0), clk.c1 - clk.c0

    def tessera_run():
        cmd = [worker, "--standalone", "--job", job_file, "--device", "cpu",
               "--threads", str(threads), "--steps", str(steps),
               "--set", "eval_every_steps=0"]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        p = subprocess.run(cmd, capture_output=True, text=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if p.returncode != 0:
            sys.stderr.write(p.stderr[-2000:])
            raise SystemExit(f"tessera-worker exited {p.returncode}")
        m = re.search(r", ([0-9.]+) examples/s, [0-9.]+ s, cpu x1, "
                      r"([0-9]+) threads?,", p.stdout)
        if not m:
            raise SystemExit("no summary line: " + p.stdout[-500:])
        if int(m.group(2)) != threads:
            raise SystemExit(f"asked for {threads} threads, the summary says "
                             f"{m.group(2)}")
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime -
                                                    before.ru_stime)
        return float(m.group(1)), cpu

    ratios = []
    name = os.path.splitext(os.path.basename(job_file))[0]
    for i in range(pairs):
        k, kc = keras_run()
        t, tc = tessera_run()
        ratios.append(t / k)
        print(f"{name} {threads} thread(s) pair {i + 1}: tessera {t:.0f} "
              f"examples/s ({tc:.2f} cpu s, with startup and evaluation), "
              f"keras fit {k:.0f} examples/s ({kc:.2f} cpu s), "
              f"ratio {t / k:.3f}", flush=True)
    ratios.sort()
    h = len(ratios) // 2
    med = ratios[h] if len(ratios) % 2 else (ratios[h - 1] + ratios[h]) / 2
    print(f"RATIO cnn_fmnist_vs_keras_fit_{threads}t {med:.3f} goal 1.0")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
