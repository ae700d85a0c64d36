/* The job file's keys: one list, in the style of the error table in
 * err.h, from which the parser (common/job_keys.c), its messages and the
 * README's table of keys are all made. A key added here is read, checked,
 * refused when misspelled and documented; tests/unit/test_job_keys.c
 * fails while the README's table differs from this list (`ninja -C build
 * readme-job-keys` rewrites it), or while a documented default differs
 * from the one tsr_job_init() sets.
 *
 * X(key, spec, default, doc): the JSON key; how its value is read; the
 * default as the README shows it (a leading number must be the default the
 * parser applies); the README's meaning column (Markdown). The keys are
 * read in this order (placement after partitioner: a partitioner resets
 * the placement to its default). The specs:
 *   INT(member, lo, hi)  an integer in [lo, hi] into an int64_t or int
 *                        member of tsr_job
 *   SECS(member)         a finite number >= 0 (seconds) into a double
 *   PATH(member)         a string (null: unset) into a char * member
 *   FN(fn, type)         fn (job_keys.c) reads the value; `type` says
 *                        what it takes, for the README
 *   OBJ(fn, type, sub)   the same, for an object whose own keys are the
 *                        list `sub` (documented as "key.sub_key" rows)
 *   NOTE(type)           accepted and not read (notes for people)
 */
#ifndef TSR_JOB_KEYS_H
#define TSR_JOB_KEYS_H

#define TSR_JOB_KEYS(X)                                                       \
  X(model, FN(jk_model, "path or object"), "required",                        \
    "a Keras `model.to_json()` file (path relative to the job file), the "    \
    "same inline, or `{\"builtin\": \"wide_deep\", ...}`")                    \
  X(loss, FN(jk_loss, "name or object"), "`\"mse\"`",                         \
    "a Keras name or Keras's serialized object (`{\"class_name\": "           \
    "\"Huber\", \"config\": {\"delta\": 2}}`): `mse`, `mae`, `huber`, `kld`, " \
    "`binary_crossentropy`, `categorical_crossentropy`, "                     \
    "`sparse_categorical_crossentropy` (`_from_logits` suffixes)")            \
  X(metrics, FN(jk_metrics, "list"), "`[]`",                                  \
    "Keras names or serialized metrics: `accuracy`, `auc` (several classes: " \
    "one-vs-rest, `multi_label` per class), `precision`, `recall`, "          \
    "`top_k_categorical_accuracy`, `sparse_top_k_categorical_accuracy`, "     \
    "`mse`, `mae`")                                                           \
  X(optimizer, FN(jk_optimizer, "name or object"), "`\"adam\"`",              \
    "`sgd`, `adagrad`, `rmsprop`, `adam`, `adamw`, `nadam`, `adamax`, "       \
    "`ftrl` with Keras's argument names and defaults; "                       \
    "`optimizer.get_config()` pasted as it is; `weight_decay`, `clipnorm`, "  \
    "`global_clipnorm`, `clipvalue`; `learning_rate` a number or a "          \
    "serialized schedule (see below)")                                        \
  X(data, FN(jk_data, "object"), "required",                                  \
    "`{\"train\": {...}, \"eval\": {...}}`: CSV, NPY/NPZ, IDX, TFRecord of "  \
    "tf.train.Example, synthetic; see [worker/INPUT.md](worker/INPUT.md)")    \
  X(batch_size, INT(batch_size, 1, 1 << 24), "32", "per worker step")         \
  X(steps, INT(steps, 0, INT64_MAX / 2), "0 (train `epochs`)",                \
    "global steps to train")                                                  \
  X(epochs, INT(epochs, 1, 1 << 30), "1 (when `steps` is 0)",                 \
    "passes over the training data (0, which trains nothing, is refused: "    \
    "`tessera evaluate` evaluates weights without training)")                 \
  X(steps_per_closure, INT(steps_per_closure, 1, 1 << 30), "10",              \
    "steps a worker runs per scheduled closure (at most two in flight per "   \
    "worker)")                                                                \
  X(mode, FN(jk_mode, "string"), "`\"async\"`",                               \
    "`\"async\"`, `\"ssp:S\"` (bounded staleness), `\"sync\"` (mean of all "  \
    "workers' gradients per step)")                                           \
  X(prefetch_params, FN(jk_prefetch_params, "boolean"), "`false`",            \
    "async only: each step computes with the values pulled while the step "  \
    "before computed (no wait for the pull, one more step of staleness)")    \
  X(dense, FN(jk_dense, "string"), "`\"ps\"`",                                \
    "where dense variables live: `\"ps\"` on the parameter servers; "        \
    "`\"allreduce\"` on every worker, kept equal by a ring all-reduce of "   \
    "their gradients (sparse tables stay on the PS); see "                    \
    "[Hybrid training](#hybrid-training-all-reduce-and-parameter-servers)")   \
  X(allreduce_bucket_bytes, INT(allreduce_bucket_bytes, 4096, 1 << 30),       \
    "4194304", "`dense` `\"allreduce\"`: gradients are all-reduced in "      \
    "buckets of about this many bytes, each as soon as the backward pass "   \
    "has produced it")                                                        \
  X(partitioner, FN(jk_partitioner, "object"), "min_size",                    \
    "how variables are cut into shards; see [Partitioning](#partitioning)")   \
  X(placement, FN(jk_placement, "string"), "`\"balanced\"`",                  \
    "`\"balanced\"` or `\"round_robin\"`; see "                               \
    "[Partitioning](#partitioning)")                                          \
  X(precision, FN(jk_precision, "string"), "`\"fp32\"`",                      \
    "`\"fp32\"`, `\"bf16\"`, `\"fp16\"` (fp16 with Keras's dynamic loss "     \
    "scaling); Keras's policy names `mixed_bfloat16`, `mixed_float16` too")   \
  X(wire_precision, FN(jk_wire_precision, "string"), "`\"fp32\"`",            \
    "`\"bf16\"`: gradients and pulled values travel as bfloat16 (round to "   \
    "nearest even), half the bytes; the PS keeps and applies float32")       \
  X(seed, FN(jk_seed, "integer >= 0"), "0",                                   \
    "initial values are a function of (seed, variable name, element), "       \
    "whatever the sharding")                                                  \
  X(checkpoint, OBJ(jk_checkpoint, "path or object", jk_checkpoint_keys),     \
    "none",                                                                   \
    "a folder (the same as `{\"dir\": ...}`) or an object of the keys below") \
  X(logdir, PATH(logdir), "none",                                             \
    "TensorBoard event files, `metrics.jsonl`, `report.html`")                \
  X(eval_every_steps, INT(eval_every_steps, 0, INT64_MAX / 2),                \
    "0 (at the end)", "evaluate every N global steps")                        \
  X(summary_every_steps, INT(summary_every_steps, 0, INT64_MAX / 2),          \
    "0 (a hundredth of the run)", "TensorBoard points by global step")        \
  X(summary_every_secs, SECS(summary_every_secs), "0 (off)",                  \
    "TensorBoard points by time as well")                                     \
  X(initial_weights, PATH(initial_weights), "none",                           \
    "an `.npz`, `.keras`, `.weights.h5` or `.h5` to start from (see Checkpoints)")   \
  X(name, NOTE("any"), "none", "a note for people; not read")                 \
  X(description, NOTE("any"), "none", "a note for people; not read")

/* checkpoint: {...} */
#define TSR_JOB_CHECKPOINT_KEYS(X)                                            \
  X(dir, PATH(checkpoint_dir), "none", "the checkpoint folder")               \
  X(every_steps, INT(checkpoint_every_steps, 0, INT64_MAX / 2),               \
    "0 (at the end only)", "a checkpoint every N global steps")               \
  X(every_secs, SECS(checkpoint_every_secs), "0 (off)",                       \
    "a checkpoint every S seconds as well")                                   \
  X(keep, INT(checkpoint_keep, 1, 1000000), "3",                              \
    "how many committed checkpoints are kept")                                \
  X(storage, FN(jk_checkpoint_storage, "string"), "`\"shared\"`",             \
    "`\"shared\"`: one folder every process sees (the chief reads each "      \
    "PS's files back before it commits); `\"per_ps\"`: each PS its own "      \
    "folder, each PS reads its own files back")

#endif /* TSR_JOB_KEYS_H */
