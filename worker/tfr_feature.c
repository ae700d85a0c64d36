/* The general decoding of one tf.train.Feature for the TFRecord reader's
 * Example scanner (tfr_example.c): a list in the usual shape (one packed
 * run) is read at once; any other legal encoding (values one per tag,
 * runs mixed, unknown fields, a oneof given twice) with every check.
 *
 * Happy path: a float_list of the feature's size is one memcpy, an
 * int64_list of ids one varint loop into the feature's column, a label
 * one value, a bytes feature with "decode" is handed to decode.c.
 * Failure modes (each message names the file, the record's byte offset
 * and the feature): a varint or length past its message, an unknown wire
 * type (TSR_EFORMAT, "malformed Example"); the wrong list type
 * (TSR_EDTYPE); a wrong value count (TSR_ESHAPE); an id outside its
 * vocabulary (TSR_ERANGE); what decode.c says of a bytes value.
 */
#include "worker/tfr_example_int.h"

#include "common/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


static const char *kind_name(int k) {
  return k == 1 ? "bytes_list" : k == 2 ? "float_list" : k == 3 ? "int64_list"
                                                                 : "no value";
}

int wk_tfr__malformed(const tfr_ctx *c, const wk_tfr_slot *sl) {
  if (!sl)
    return tsr_errf(c->err, c->errlen, TSR_EFORMAT,
                    "%s: record at byte offset %llu: malformed Example",
                    c->path, (unsigned long long)c->off);
  return tsr_errf(c->err, c->errlen, TSR_EFORMAT,
                  "%s: record at byte offset %llu: malformed Example "
                  "(feature \"%s\")",
                  c->path, (unsigned long long)c->off, sl->name);
}

int wk_tfr__out_of_vocab(const tfr_ctx *c, const wk_tfr_slot *sl,
                         uint64_t v) {
  int64_t id = (int64_t)v;
  int64_t vocab = sl->id_lim >> 63 ? 0 : (int64_t)sl->id_lim;
  return tsr_errf(c->err, c->errlen, TSR_ERANGE,
                  "%s: record at byte offset %llu: feature \"%s\": id %lld "
                  "is outside its vocabulary [0, %lld)",
                  c->path, (unsigned long long)c->off, sl->name,
                  (long long)id, (long long)vocab);
}

static int decode_bytes(const wk_tfr_slot *sl, const uint8_t *bp, size_t bl,
                        const wk_row *o, const tfr_ctx *c) {
  char why[256];
  int rc = wk_decode__bytes(sl->decode, bp, bl, o->x + sl->at, sl->size, why,
                            sizeof why);
  if (rc == TSR_ENOMEM) return rc;
  if (rc)
    return tsr_errf(c->err, c->errlen, rc,
                    "%s: record at byte offset %llu: feature \"%s\": %s",
                    c->path, (unsigned long long)c->off, sl->name, why);
  return 0;
}



/* A Feature in the usual shape: exactly one list (tag 1, 2 or 3) whose
 * only content is one length-delimited field 1 (the packed values, or a
 * bytes_list's one value) reaching its end. Gives the list's kind and the
 * run's bytes; false for anything else (the general path decides). */
static inline bool usual_shape(const uint8_t *p, const uint8_t *end,
                               int *kind, const uint8_t **q,
                               const uint8_t **qe) {
  uint64_t n;
  if (p >= end) return false;
  uint8_t t = *p++;
  if (t != 0x0a && t != 0x12 && t != 0x1a) return false;
  if (varint(&p, end, &n) || n != (uint64_t)(end - p)) return false;
  if (p >= end || *p++ != 0x0a) return false;
  if (varint(&p, end, &n) || n != (uint64_t)(end - p)) return false;
  *kind = t >> 3;
  *q = p;
  *qe = end;
  return true;
}


/* The fast path: 1 when the Feature was decoded, 0 when the general path
 * must look at it (it then overwrites whatever this wrote), < 0 on an
 * error it is sure of. */
static int decode_fast(const wk_tfr_slot *sl, const uint8_t *p,
                       const uint8_t *end, const wk_row *o,
                       const tfr_ctx *c) {
  int kind, rc;
  const uint8_t *q, *qe;
  if (!usual_shape(p, end, &kind, &q, &qe)) return 0;
  size_t nb = (size_t)(qe - q);
  if (sl->decode) {
    if (kind != 1) return 0;
    rc = decode_bytes(sl, q, nb, o, c);
    return rc ? rc : 1;
  }
  uint64_t v;
  switch (sl->kind) {
    case WK_TFR_SPARSE:
      if (kind != 3) return 0;
      rc = ids_run(sl, q, qe, o->offs[sl->index][o->row], o, c);
      return rc ? rc : 1;
    case WK_TFR_DENSE:
      if (kind == 2) {
        if (nb != (size_t)sl->size * 4) return 0;
        memcpy(o->x + sl->at, q, nb); /* little-endian hosts, as the PS */
        return 1;
      }
      if (kind == 3) {
        float *x = o->x + sl->at;
        int64_t k = 0;
        while (q < qe && k < sl->size) {
          if (varint3(&q, qe, &v)) return 0;
          x[k++] = (float)(int64_t)v;
        }
        return q == qe && k == sl->size;
      }
      return 0;
    case WK_TFR_LABEL:
      if (kind == 2 && nb == 4) {
        float y;
        memcpy(&y, q, 4);
        *o->y = y;
        return 1;
      }
      if (kind == 3 && !varint3(&q, qe, &v) && q == qe) {
        *o->y = (float)(double)(int64_t)v;
        return 1;
      }
      return 0;
  }
  return 0;
}

/* The one bytes value of a bytes_list Feature with "decode" (raw or an
 * image). */
static int decode_general_bytes(const wk_tfr_slot *sl, int kind,
                                const uint8_t *lp, const uint8_t *le,
                                const wk_row *o, const tfr_ctx *c) {
  const uint8_t *bp = NULL, *p = lp;
  uint64_t bl = 0;
  int nval = 0;
  while (kind == 1 && p < le) {
    uint64_t tag;
    if (varint(&p, le, &tag)) return wk_tfr__malformed(c, sl);
    if ((tag >> 3) == 1 && (tag & 7) == 2) {
      if (varint(&p, le, &bl) || bl > (uint64_t)(le - p))
        return wk_tfr__malformed(c, sl);
      if (nval++ == 0) bp = p;
      p += bl;
    } else if (skip_field(&p, le, (int)(tag & 7))) {
      return wk_tfr__malformed(c, sl);
    }
  }
  if (kind != 1 || nval != 1)
    return tsr_errf(c->err, c->errlen, TSR_EDTYPE,
                    "%s: record at byte offset %llu: feature \"%s\" "
                    "(decode %s) must be a bytes_list of one value; "
                    "it is a %s%s",
                    c->path, (unsigned long long)c->off, sl->name,
                    wk_decode__name(sl->decode), kind_name(kind),
                    kind == 1 ? " of several values" : "");
  if (!bp) bl = 0;
  return decode_bytes(sl, bp ? bp : lp, (size_t)bl, o, c);
}

/* Decodes one Feature's values into the row per its slot: any legal
 * encoding, every check. */
static int decode_general(const wk_tfr_slot *sl, const uint8_t *p,
                          const uint8_t *end, const wk_row *o,
                          const tfr_ctx *c) {
  int kind = 0;
  const uint8_t *lp = NULL, *le = NULL;
  while (p < end) {
    uint64_t tag, len;
    if (varint(&p, end, &tag)) return wk_tfr__malformed(c, sl);
    int f = (int)(tag >> 3), wt = (int)(tag & 7);
    if (f >= 1 && f <= 3 && wt == 2) {
      if (varint(&p, end, &len) || len > (uint64_t)(end - p))
        return wk_tfr__malformed(c, sl);
      kind = f; /* oneof: the last one wins */
      lp = p;
      le = p + len;
      p += len;
    } else if (skip_field(&p, end, wt)) {
      return wk_tfr__malformed(c, sl);
    }
  }
  if (sl->decode) return decode_general_bytes(sl, kind, lp, le, o, c);
  int want = sl->kind == WK_TFR_SPARSE ? 3 : 2;
  if (kind != want && !(sl->kind != WK_TFR_SPARSE && kind == 3))
    return tsr_errf(c->err, c->errlen, TSR_EDTYPE,
                    "%s: record at byte offset %llu: feature \"%s\" is "
                    "a %s, expected %s",
                    c->path, (unsigned long long)c->off, sl->name,
                    kind_name(kind),
                    sl->kind != WK_TFR_SPARSE ? "a float_list or "
                                                "int64_list (or set "
                                                "\"decode\" for bytes)"
                                              : kind_name(want));
  /* values: field 1, packed (wire type 2) or one per tag (5 / 0) */
  int64_t cnt = 0;
  float *fx = sl->kind == WK_TFR_DENSE ? o->x + sl->at : NULL;
  int sf = sl->index;
  int64_t f_at = sl->kind == WK_TFR_SPARSE ? o->offs[sf][o->row] : 0;
  double label = 0;
  p = lp;
  while (p < le) {
    uint64_t tag, v;
    if (varint(&p, le, &tag)) return wk_tfr__malformed(c, sl);
    int f = (int)(tag >> 3), wt = (int)(tag & 7);
    if (f != 1) {
      if (skip_field(&p, le, wt)) return wk_tfr__malformed(c, sl);
      continue;
    }
    if (kind == 2 && (wt == 2 || wt == 5)) {
      uint64_t nb = 4;
      if (wt == 2 && (varint(&p, le, &nb) || nb > (uint64_t)(le - p) ||
                      nb % 4))
        return wk_tfr__malformed(c, sl);
      if (wt == 5 && le - p < 4) return wk_tfr__malformed(c, sl);
      int64_t k = (int64_t)(nb / 4);
      if (fx) {
        if (cnt + k <= sl->size) memcpy(fx + cnt, p, (size_t)nb);
      } else if (k > 0 && cnt == 0) {
        float fv;
        memcpy(&fv, p, 4);
        label = fv;
      }
      cnt += k;
      p += nb;
    } else if (kind == 3 && (wt == 2 || wt == 0)) {
      const uint8_t *ve = le;
      if (wt == 2) {
        uint64_t nb;
        if (varint(&p, le, &nb) || nb > (uint64_t)(le - p))
          return wk_tfr__malformed(c, sl);
        ve = p + nb;
      }
      for (bool once = wt == 0; once || p < ve; once = false) {
        if (varint(&p, ve, &v)) return wk_tfr__malformed(c, sl);
        if (sl->kind == WK_TFR_SPARSE) {
          if (v >= sl->id_lim)
            return wk_tfr__out_of_vocab(c, sl, v);
          if (col_reserve(o, sf, (size_t)(f_at + cnt + 1)))
            return TSR_ENOMEM;
          o->ids[sf][f_at + cnt] = (int64_t)v;
        } else if (fx) {
          if (cnt < sl->size) fx[cnt] = (float)(int64_t)v;
        } else if (cnt == 0) {
          label = (double)(int64_t)v;
        }
        cnt++;
        if (once) break;
      }
    } else if (kind == 1) {
      if (skip_field(&p, le, wt)) return wk_tfr__malformed(c, sl);
    } else {
      return wk_tfr__malformed(c, sl);
    }
  }
  if (sl->kind == WK_TFR_DENSE && cnt != sl->size)
    return tsr_errf(c->err, c->errlen, TSR_ESHAPE,
                    "%s: record at byte offset %llu: feature \"%s\" "
                    "has %lld values, expected %lld",
                    c->path, (unsigned long long)c->off, sl->name,
                    (long long)cnt, (long long)sl->size);
  if (sl->kind == WK_TFR_LABEL) {
    if (cnt != 1)
      return tsr_errf(c->err, c->errlen, TSR_ESHAPE,
                      "%s: record at byte offset %llu: label \"%s\" "
                      "has %lld values, expected 1",
                      c->path, (unsigned long long)c->off, sl->name,
                      (long long)cnt);
    *o->y = (float)label;
  }
  if (sl->kind == WK_TFR_SPARSE) o->offs[sf][o->row + 1] = f_at + cnt;
  return 0;
}

int wk_tfr__feature(const wk_tfr_slot *sl, const uint8_t *p,
                    const uint8_t *end, const wk_row *o, const tfr_ctx *c) {
  int rc = decode_fast(sl, p, end, o, c);
  if (rc) return rc < 0 ? rc : 0;
  return decode_general(sl, p, end, o, c);
}
