/* Helpers shared by the input pipeline's tests: a scratch folder, files
 * written into it, a job file loaded from it, and draining an input. */
#ifndef TSR_TEST_INPUT_H
#define TSR_TEST_INPUT_H

#include <ftw.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/job.h"
#include "worker/input.h"

static int rm_one(const char *p, const struct stat *sb, int flag,
                  struct FTW *ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  return remove(p);
}

static inline void tdir_remove(char *dir) {
  if (dir) nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
  free(dir);
}

static inline char *tdir_make(void) {
  const char *base = getenv("TMPDIR");
  char *d = malloc(4096);
  snprintf(d, 4096, "%s/tsr_input_XXXXXX", base && *base ? base : "/tmp");
  if (!mkdtemp(d)) {
    free(d);
    return NULL;
  }
  return d;
}

static inline char *tpath(const char *dir, const char *name) {
  static char buf[8][4096];
  static int k;
  char *b = buf[k++ & 7];
  snprintf(b, 4096, "%s/%s", dir, name);
  return b;
}

static inline void twrite(const char *dir, const char *name, const void *data,
                          size_t len) {
  FILE *f = fopen(tpath(dir, name), "wb");
  if (!f) abort();
  if (len && fwrite(data, 1, len, f) != len) abort();
  fclose(f);
}

static inline void twrites(const char *dir, const char *name,
                           const char *text) {
  twrite(dir, name, text, strlen(text));
}

/* Writes dir/job.json with the given text and loads it. */
/* The tests read splits in file order unless they ask for a shuffle:
 * data.train.shuffle_buffer is 0 when the text does not set it (the
 * default, the whole data set, is tested on its own in
 * test_input_pipeline.c with tjob_default). */
static inline int tjob_default(const char *dir, const char *text,
                               tsr_job *job, char *err, size_t errlen) {
  twrites(dir, "job.json", text);
  return tsr_job_load(tpath(dir, "job.json"), NULL, job, err, errlen);
}

static inline int tjob(const char *dir, const char *text, tsr_job *job,
                       char *err, size_t errlen) {
  int rc = tjob_default(dir, text, job, err, errlen);
  if (rc) return rc;
  json_t *tr = json_object_get(job->data, "train");
  if (json_is_object(tr) && !json_object_get(tr, "shuffle_buffer"))
    json_object_set_new(tr, "shuffle_buffer", json_integer(0));
  return 0;
}

static inline wk_input_opts topts(int W, int w, int64_t batch, int64_t epochs,
                                  uint64_t seed) {
  wk_input_opts o;
  memset(&o, 0, sizeof o);
  o.worker_index = w;
  o.num_workers = W;
  o.batch_size = batch;
  o.epochs = epochs;
  o.seed = seed;
  return o;
}

/* Drains an input into arrays of y values and the first feature (up to
 * cap examples); returns the count, or a negative code. */
static inline int64_t tdrain(wk_input *in, float *ys, float *x0, int64_t cap,
                             int64_t *nbatches) {
  const wk_batch *b;
  int64_t n = 0, nb = 0;
  int rc;
  while ((rc = wk_input_next(in, &b)) == 0) {
    for (int64_t i = 0; i < b->n; i++, n++) {
      if (n < cap) {
        if (ys) ys[n] = b->y[i];
        if (x0) x0[n] = b->n_dense ? b->x[i * b->n_dense] : 0;
      }
    }
    nb++;
  }
  if (nbatches) *nbatches = nb;
  return rc == TSR_EEOF ? n : rc;
}


/* The fixture every input test uses: a scratch folder, a job, the input
 * opened from it, and room for an error message. */
typedef struct {
  char *dir;
  tsr_job job;
  wk_input *in;
  char err[512];
} fx;

static inline int setup(void **state) {
  fx *f = calloc(1, sizeof *f);
  f->dir = tdir_make();
  tsr_job_init(&f->job);
  *state = f;
  return f->dir ? 0 : -1;
}

static inline int teardown(void **state) {
  fx *f = *state;
  wk_input_close(f->in);
  tsr_job_free(&f->job);
  tdir_remove(f->dir);
  free(f);
  return 0;
}

#endif
