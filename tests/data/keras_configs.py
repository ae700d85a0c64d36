"""Writes keras_configs.json: what Keras 3 and tf_keras write for every
optimizer, learning-rate schedule, loss and metric the README lists, as
get_config() and serialize() give them, pasted by tests/unit/test_keras_paste.c.

    python keras_configs.py > keras_configs.json   # needs tensorflow-cpu, tf_keras

Each entry: {"keras": version, "kind": "optimizer" | "schedule" | "loss" |
"metric", "form": how it was written, "value": the JSON, "expect": the
Tessera name it must resolve to, or "!" and a part of the message it must
be refused with}.
"""
import json
import sys

import keras
import tf_keras

OPTIMIZERS = {"SGD": "sgd", "Adagrad": "adagrad", "RMSprop": "rmsprop",
              "Adam": "adam", "AdamW": "adamw", "Nadam": "nadam",
              "Adamax": "adamax", "Ftrl": "ftrl"}
LOSSES = {"MeanSquaredError": "mse", "MeanAbsoluteError": "mae",
          "Huber": "huber", "KLDivergence": "kld",
          "BinaryCrossentropy": "binary_crossentropy",
          "CategoricalCrossentropy": "categorical_crossentropy",
          "SparseCategoricalCrossentropy": "sparse_categorical_crossentropy"}
METRICS = {"BinaryAccuracy": "binary_accuracy",
           "CategoricalAccuracy": "categorical_accuracy",
           "SparseCategoricalAccuracy": "sparse_categorical_accuracy",
           "AUC": "auc", "Precision": "precision", "Recall": "recall",
           "TopKCategoricalAccuracy": "top_k_categorical_accuracy",
           "SparseTopKCategoricalAccuracy":
               "sparse_top_k_categorical_accuracy",
           "MeanSquaredError": "mse", "MeanAbsoluteError": "mae"}


def schedules(k):
    s = k.optimizers.schedules
    return {
        "ExponentialDecay": s.ExponentialDecay(0.1, 100, 0.96),
        "PiecewiseConstantDecay": s.PiecewiseConstantDecay([100, 200],
                                                           [0.1, 0.01, 0.0]),
        # Keras's own warmup example starts from a rate of 0
        "CosineDecay": s.CosineDecay(0.0, 1000, warmup_target=0.1,
                                     warmup_steps=150),
        "CosineDecayRestarts": s.CosineDecayRestarts(0.1, 100),
        "PolynomialDecay": s.PolynomialDecay(0.1, 100, 0.0),
        "InverseTimeDecay": s.InverseTimeDecay(0.1, 100, 0.5),
    }


def plain(x):
    """JSON as json.dumps writes it (tuples as lists, numpy scalars as numbers)."""
    return json.loads(json.dumps(x, default=lambda o: o.item()
                                 if hasattr(o, "item") else str(o)))


def entries(k, version):
    out = []

    def add(kind, form, value, expect):
        out.append({"keras": version, "kind": kind, "form": form,
                    "value": plain(value), "expect": expect})

    for cls, name in OPTIMIZERS.items():
        make = getattr(k.optimizers, cls)
        first, second = make(), make()
        add("optimizer", "get_config", first.get_config(), name)
        add("optimizer", "get_config, a second instance",
            second.get_config(), name)
        add("optimizer", "serialize", k.optimizers.serialize(first), name)
        # Keras takes a rate of 0 everywhere; FTRL divides by it, so
        # Tessera refuses that one, saying why
        add("optimizer", "get_config, learning_rate 0",
            make(learning_rate=0.0).get_config(),
            "!divides by the rate" if name == "ftrl" else name)
        sched = make(learning_rate=schedules(k)["CosineDecay"])
        add("optimizer", "get_config, a schedule", sched.get_config(), name)
    for cls, sch in schedules(k).items():
        add("schedule", "serialize",
            k.optimizers.schedules.serialize(sch), cls)
    for cls, name in LOSSES.items():
        add("loss", "serialize", k.losses.serialize(getattr(k.losses, cls)()),
            name)
    for cls, name in METRICS.items():
        add("metric", "serialize",
            k.metrics.serialize(getattr(k.metrics, cls)()), name)
    return out


def main():
    rows = (entries(keras, "keras " + keras.__version__) +
            entries(tf_keras, "tf_keras " + tf_keras.__version__))
    json.dump(rows, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
