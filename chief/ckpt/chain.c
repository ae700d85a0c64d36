/* Incremental checkpoints as the chief sees them (ckpt.h): an increment's
 * manifest names the checkpoint it builds on, and that one the one
 * before, back to a whole one; restoring, verifying or exporting it takes
 * every link of that chain, the whole one first.
 *
 * Manifest keys: "kind" ("full" or "increment"; absent: full), for an
 * increment "previous" {"step", "checkpoint_id"} (the checkpoint whose
 * state its rows overlay), and for both "base_step" (the whole one the
 * chain starts at) and "links" (the chain's length, 1 for a whole one).
 *
 * Failure modes: a link whose manifest is missing or unreadable, one that
 * holds another checkpoint than the one named (written again since), a
 * chain longer than CHIEF_CKPT_CHAIN_MAX or one that does not go back in
 * steps: each an error naming the folder and the link, which makes the
 * checkpoint not intact (a restore falls back to an older one). A link
 * whose files hold no part of a sparse variable of the increment: an
 * error naming the variable and the link.
 */
#include "chief/ckpt/ckpt.h"
#include "chief/ckpt/ckpt_read.h"
#include "common/err.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool chief_ckpt_is_increment(const json_t *manifest) {
  const char *k = json_string_value(json_object_get(manifest, "kind"));
  return k && !strcmp(k, "increment");
}

int64_t chief_ckpt_base_step(const json_t *manifest, int64_t step) {
  json_t *b = json_object_get(manifest, "base_step");
  return chief_ckpt_is_increment(manifest) && json_is_integer(b)
             ? json_integer_value(b)
             : step;
}

int chief_ckpt_chain(const char *root, int64_t step, const json_t *manifest,
                     chief_ckpt_link *links, size_t *n, char *err,
                     size_t errlen) {
  chief_ckpt_link rev[CHIEF_CKPT_CHAIN_MAX];
  size_t k = 0;
  json_t *m = json_incref((json_t *)manifest);
  int64_t at = step;
  int rc = 0;
  for (;;) {
    const char *id = json_string_value(json_object_get(m, "checkpoint_id"));
    if (k == CHIEF_CKPT_CHAIN_MAX) {
      rc = tsr_errf(err, errlen, TSR_ERANGE, "the checkpoint of step %" PRId64
                    " builds on a chain of more than %d checkpoints", step,
                    CHIEF_CKPT_CHAIN_MAX);
      break;
    }
    rev[k].step = at;
    snprintf(rev[k].id, sizeof rev[k].id, "%s", id ? id : "");
    k++;
    if (!chief_ckpt_is_increment(m)) break;
    json_t *prev = json_object_get(m, "previous");
    json_t *ps = json_object_get(prev, "step");
    const char *pid =
        json_string_value(json_object_get(prev, "checkpoint_id"));
    if (!json_is_integer(ps) || !pid || json_integer_value(ps) >= at ||
        json_integer_value(ps) < 0) {
      rc = tsr_errf(err, errlen, TSR_EFORMAT, "the manifest of the "
                    "checkpoint of step %" PRId64 " is an increment without "
                    "a previous checkpoint of a lower step", at);
      break;
    }
    int64_t p = json_integer_value(ps);
    char dir[4096], why[1024] = "path too long";
    int64_t got;
    json_t *pm = NULL;
    if ((rc = chief_ckpt_dir(root, p, dir, sizeof dir)) ||
        (rc = chief_ckpt_read(dir, &got, &pm, NULL, 0, why, sizeof why))) {
      rc = tsr_errf(err, errlen, rc, "the checkpoint of "
                    "step %" PRId64 " builds on the checkpoint of step %"
                    PRId64 " (%s), which is not there: %s", step, p, pid,
                    why);
      break;
    }
    const char *gid = json_string_value(json_object_get(pm, "checkpoint_id"));
    if (got != p || !gid || strcmp(gid, pid)) {
      rc = tsr_errf(err, errlen, TSR_ESTALE, "the checkpoint of step %" PRId64
                    " builds on checkpoint \"%s\" of step %" PRId64 ", but %s "
                    "holds \"%s\" (written again since)", step, pid, p, dir,
                    gid ? gid : "");
      json_decref(pm);
      break;
    }
    json_decref(m);
    m = pm;
    at = p;
  }
  json_decref(m);
  if (rc) return rc;
  for (size_t i = 0; i < k; i++) links[i] = rev[k - 1 - i];
  *n = k;
  return 0;
}

int chief_ckpt_verify_chain(const char *root, int64_t step,
                            const json_t *manifest, char *why,
                            size_t whylen) {
  if (!chief_ckpt_is_increment(manifest)) return 0;
  chief_ckpt_link links[CHIEF_CKPT_CHAIN_MAX];
  size_t n;
  int rc = chief_ckpt_chain(root, step, manifest, links, &n, why, whylen);
  for (size_t i = 0; !rc && i + 1 < n; i++) {
    char dir[4096], sub[1024] = "path too long";
    int64_t got;
    json_t *m = NULL;
    if ((rc = chief_ckpt_dir(root, links[i].step, dir, sizeof dir)) ||
        (rc = chief_ckpt_read(dir, &got, &m, NULL, 0, sub, sizeof sub)) ||
        (rc = chief_ckpt_verify(dir, m, sub, sizeof sub)))
      rc = tsr_errf(why, whylen, rc, "it builds on the checkpoint of step %"
                    PRId64 ", which is damaged: %s", links[i].step, sub);
    json_decref(m);
  }
  return rc;
}

void chief_ckpt_links_free(chief_ckpt_scanned *links, size_t n) {
  for (size_t i = 0; links && i < n; i++)
    chief_ckpt_vars_free(links[i].vars, links[i].n);
  free(links);
}

int chief_ckpt_scan_links(const char *folder, int64_t step,
                          const json_t *manifest, chief_ckpt_scanned **links,
                          size_t *n, char *err, size_t errlen) {
  *links = NULL;
  *n = 0;
  if (!chief_ckpt_is_increment(manifest)) return 0;
  char root[4096];
  chief_ckpt_root_of(folder, root, sizeof root);
  chief_ckpt_link chain[CHIEF_CKPT_CHAIN_MAX];
  size_t nl = 0;
  int rc = chief_ckpt_chain(root, step, manifest, chain, &nl, err, errlen);
  if (rc) return rc;
  chief_ckpt_scanned *out = calloc(nl ? nl : 1, sizeof *out);
  if (!out) return tsr_errf(err, errlen, TSR_ENOMEM, "out of memory");
  size_t k = 0;
  for (; !rc && k + 1 < nl; k++) {
    char dir[4096];
    if ((rc = chief_ckpt_dir(root, chain[k].step, dir, sizeof dir)))
      tsr_errf(err, errlen, rc, "%s: checkpoint path too long", root);
    else
      rc = chief_ckpt_scan(dir, &out[k].vars, &out[k].n, err, errlen);
  }
  if (rc) {
    chief_ckpt_links_free(out, k);
    return rc;
  }
  *links = out;
  *n = k;
  return 0;
}

int chief_ckpt_load_chain(const chief_ckpt_var *v,
                          const chief_ckpt_scanned *links, size_t n_links,
                          float *out, uint8_t *present, char *err,
                          size_t errlen) {
  if (!v->sparse || n_links == 0)
    return chief_ckpt_load_value(v, out, present, err, errlen);
  for (size_t l = 0; l < n_links; l++) {
    const chief_ckpt_var *bv = NULL;
    for (size_t i = 0; i < links[l].n && !bv; i++)
      if (!strcmp(links[l].vars[i].name, v->name)) bv = &links[l].vars[i];
    if (!bv)
      return tsr_errf(err, errlen, TSR_ENOTFOUND, "%s: no part in the "
                      "checkpoint it builds on (link %zu)", v->name, l);
    int rc = l ? chief_ckpt_overlay_value(bv, out, present, err, errlen)
               : chief_ckpt_load_value(bv, out, present, err, errlen);
    if (rc) return rc;
  }
  return chief_ckpt_overlay_value(v, out, present, err, errlen);
}
