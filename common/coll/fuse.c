/* Gradient buckets (coll.h, "gradient buckets"): the layout of the fusion
 * buffer and the per-step bookkeeping of which bucket may go out.
 *
 * Layout. Tensors are taken in final order and packed into buckets: a
 * bucket closes when the next tensor would take it past bucket_bytes (a
 * tensor larger than that alone). The fusion buffer lists the buckets in
 * that order and, inside one, its tensors in that order, so a bucket is
 * one contiguous run of floats: the all-reduce needs no gather.
 *
 * Failure modes: the first post or wait that fails is kept and returned
 * by every later call of the step, so the caller sees one cause.
 */
#include "common/coll/coll.h"
#include "common/err.h"
#include "common/mem.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tsr_coll_fuse {
  int n, nb;
  size_t *off;          /* [n] floats from the buffer's start */
  int *bucket;          /* [n] bucket of each tensor */
  int *members;         /* tensors by bucket, in final order */
  int *first;           /* [nb + 1] into members */
  size_t *bfloats;      /* [nb] */
  size_t *boff;         /* [nb] */
  float *buf;
  /* a step */
  tsr_coll *c;
  bool *ready;          /* [n] */
  int *left;            /* [nb] tensors not final yet */
  tsr_coll_ticket *t;   /* [nb] */
  bool *waited;         /* [nb] */
  int next;             /* the next bucket to post */
  int rc;
  char err[TSR_COLL_ERR_MAX];
};

void tsr_coll_fuse_free(tsr_coll_fuse *f) {
  if (!f) return;
  free(f->off);
  free(f->bucket);
  free(f->members);
  free(f->first);
  free(f->bfloats);
  free(f->boff);
  free(f->buf);
  free(f->ready);
  free(f->left);
  free(f->t);
  free(f->waited);
  free(f);
}

int tsr_coll_fuse_new(tsr_coll_fuse **out, const size_t *counts,
                      const int *order, int n, size_t bucket_bytes) {
  *out = NULL;
  if (n < 0 || bucket_bytes < sizeof(float) || (n && !counts))
    return TSR_EINVAL;
  size_t cap = bucket_bytes / sizeof(float);
  tsr_coll_fuse *f = calloc(1, sizeof *f);
  if (!f) return TSR_ENOMEM;
  size_t na = n ? (size_t)n : 1;
  f->n = n;
  const tsr_array per_tensor[] = {
      TSR_ARRAY(f->off), TSR_ARRAY(f->bucket), TSR_ARRAY(f->members),
      TSR_ARRAY(f->bfloats), TSR_ARRAY(f->boff), TSR_ARRAY(f->ready),
      TSR_ARRAY(f->left), TSR_ARRAY(f->t), TSR_ARRAY(f->waited)};
  int rc = tsr_calloc_each(per_tensor,
                           sizeof per_tensor / sizeof per_tensor[0], na);
  f->first = calloc(na + 1, sizeof *f->first);
  if (rc || !f->first) {
    rc = TSR_ENOMEM;
    goto fail;
  }
  /* the order must name every tensor once */
  rc = TSR_EINVAL;
  for (int i = 0; i < n; i++) f->bucket[i] = -1;
  for (int i = 0; i < n; i++) {
    int t = order ? order[i] : n - 1 - i;
    if (t < 0 || t >= n || f->bucket[t] != -1) goto fail;
    f->bucket[t] = 0;
    f->members[i] = t;
  }
  size_t total = 0, in_bucket = 0;
  int b = -1;
  for (int i = 0; i < n; i++) {
    int t = f->members[i];
    if (b < 0 || (in_bucket > 0 && in_bucket + counts[t] > cap)) {
      b++;
      f->first[b] = i;
      f->boff[b] = total;
      in_bucket = 0;
    }
    f->bucket[t] = b;
    f->off[t] = total;
    total += counts[t];
    in_bucket += counts[t];
    f->bfloats[b] += counts[t];
  }
  f->nb = b + 1;
  f->first[f->nb] = n;
  rc = TSR_ENOMEM;
  if (posix_memalign((void **)&f->buf, 64,
                     (total ? total : 1) * sizeof(float)))
    goto fail;
  memset(f->buf, 0, (total ? total : 1) * sizeof(float));
  *out = f;
  return 0;
fail:
  tsr_coll_fuse_free(f);
  return rc;
}

float *tsr_coll_fuse_slot(const tsr_coll_fuse *f, int t) {
  return f->buf + f->off[t];
}

int tsr_coll_fuse_nbuckets(const tsr_coll_fuse *f) { return f->nb; }

const int *tsr_coll_fuse_members(const tsr_coll_fuse *f, int b, int *n) {
  *n = f->first[b + 1] - f->first[b];
  return f->members + f->first[b];
}

size_t tsr_coll_fuse_bucket_floats(const tsr_coll_fuse *f, int b) {
  return f->bfloats[b];
}

void tsr_coll_fuse_start(tsr_coll_fuse *f, tsr_coll *c) {
  f->c = c;
  f->next = 0;
  f->rc = 0;
  f->err[0] = 0;
  for (int i = 0; i < f->n; i++) f->ready[i] = false;
  for (int b = 0; b < f->nb; b++) {
    f->left[b] = f->first[b + 1] - f->first[b];
    f->t[b] = 0;
    f->waited[b] = false;
  }
}

/* Posts buckets in order while the next one is complete. */
static int post_ready(tsr_coll_fuse *f) {
  while (f->c && !f->rc && f->next < f->nb && f->left[f->next] == 0) {
    int b = f->next;
    tsr_coll_req q = {TSR_COLL_ALLREDUCE, f->buf + f->boff[b], f->bfloats[b],
                      0, NULL, NULL};
    int rc = tsr_coll_submit(f->c, &q, &f->t[b]);
    if (rc) {
      f->rc = rc;
      snprintf(f->err, sizeof f->err, "all-reduce of gradient bucket %d: %s",
               b, tsr_strerror(rc));
      break;
    }
    f->next++;
  }
  return f->rc;
}

int tsr_coll_fuse_ready(tsr_coll_fuse *f, int t) {
  if (t < 0 || t >= f->n) return TSR_EINVAL;
  if (!f->ready[t]) {
    f->ready[t] = true;
    f->left[f->bucket[t]]--;
  }
  return post_ready(f);
}

int tsr_coll_fuse_flush(tsr_coll_fuse *f) {
  for (int t = 0; t < f->n; t++)
    if (!f->ready[t]) {
      f->ready[t] = true;
      f->left[f->bucket[t]]--;
    }
  return post_ready(f);
}

int tsr_coll_fuse_wait(tsr_coll_fuse *f, int b, char *err, size_t errlen,
                       uint64_t *post_ns, uint64_t *done_ns) {
  if (b < 0 || b >= f->nb) return TSR_EINVAL;
  if (!f->waited[b] && f->t[b]) {
    char e[TSR_COLL_ERR_MAX];
    int rc = tsr_coll_wait_timed(f->c, f->t[b], e, sizeof e, post_ns,
                                 done_ns);
    f->waited[b] = true;
    f->t[b] = 0;
    if (rc && !f->rc) {
      f->rc = rc;
      snprintf(f->err, sizeof f->err, "%s", e);
    }
  } else if (!f->t[b] && !f->waited[b] && !f->rc) {
    f->rc = TSR_EINVAL;
    snprintf(f->err, sizeof f->err, "gradient bucket %d waited for before "
             "it was posted", b);
  }
  if (f->rc && err && errlen) snprintf(err, errlen, "%s", f->err);
  return f->rc;
}

void tsr_coll_fuse_drain(tsr_coll_fuse *f) {
  for (int b = 0; b < f->nb; b++)
    if (f->t[b]) tsr_coll_fuse_wait(f, b, NULL, 0, NULL, NULL);
}

int tsr_coll_fuse_wait_all(tsr_coll_fuse *f, char *err, size_t errlen) {
  tsr_coll_fuse_flush(f);
  int first = 0;
  /* every posted bucket is waited for, even after a failure: no ticket
   * may stay open on buffers the caller reuses */
  for (int b = 0; b < f->nb; b++) {
    if (!f->t[b]) continue;
    int rc = tsr_coll_fuse_wait(f, b, NULL, 0, NULL, NULL);
    if (rc && !first) first = rc;
  }
  if (!first) first = f->rc;
  if (first && err && errlen) snprintf(err, errlen, "%s", f->err);
  return first;
}
