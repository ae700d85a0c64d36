/* CSV reader: a header line of column names, then one example per line,
 * with RFC 4180 quoting (a cell in double quotes may hold the delimiter, a
 * line end, or "" for a quote) and a configurable delimiter.
 *
 * Happy path: read the file (gzip allowed), map the label and feature
 * columns by name, parse every needed cell as a number into a table.
 * Records are cut at line ends outside quotes; a file without quotes takes
 * the memchr fast path.
 * Failure modes, each naming the file and line: a label or feature column
 * missing from the header (with a hint when the header looks split by
 * another delimiter), a row whose cell count differs from the header
 * (ragged), an unterminated quote, a cell that is empty or not a finite
 * number (the message gives the line, the data row, the column number and
 * name, and the text).
 */
#include "worker/input_int.h"

#include "common/err.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Trims blanks and one pair of double quotes. */
static void trim(const char **a, const char **b) {
  while (*a < *b && (**a == ' ' || **a == '\t')) (*a)++;
  while (*b > *a && ((*b)[-1] == ' ' || (*b)[-1] == '\t' || (*b)[-1] == '\r'))
    (*b)--;
  if (*b - *a >= 2 && **a == '"' && (*b)[-1] == '"') {
    (*a)++;
    (*b)--;
  }
}

/* Splits one record into cell bounds at delimiters outside quotes;
 * returns the count (may exceed max, in which case only max are stored). */
static int64_t split_line(const char *p, const char *end, char delim,
                          const char **ca, const char **cb, int64_t max) {
  int64_t n = 0;
  const char *s = p;
  bool inq = false;
  for (const char *q = p;; q++) {
    if (q < end && *q == '"') {
      inq = !inq; /* "" inside quotes toggles twice */
      continue;
    }
    if (q == end || (*q == delim && !inq)) {
      if (n < max) {
        ca[n] = s;
        cb[n] = q;
      }
      n++;
      if (q == end) break;
      s = q + 1;
    }
  }
  return n;
}

/* The end of the record that starts at p: the first line end outside
 * quotes (or `end`); *lines counts the line ends inside it; *open is set
 * when a quote is still open at the end of the file. */
static const char *record_end(const char *p, const char *end, int64_t *lines,
                              bool *open) {
  const char *nl = memchr(p, '\n', (size_t)(end - p));
  const char *le = nl ? nl : end;
  *lines = 0;
  *open = false;
  if (!memchr(p, '"', (size_t)(le - p))) return le;
  bool inq = false;
  for (const char *q = p; q < end; q++) {
    if (*q == '"') inq = !inq;
    else if (*q == '\n') {
      if (!inq) return q;
      (*lines)++;
    }
  }
  *open = inq;
  return end;
}

/* A header cell as text: outer quotes gone, "" turned into ". */
static char *cell_text(const char *a, const char *b) {
  trim(&a, &b);
  char *t = malloc((size_t)(b - a) + 1), *o = t;
  if (!t) return NULL;
  for (const char *q = a; q < b; q++) {
    *o++ = *q;
    if (*q == '"' && q + 1 < b && q[1] == '"') q++;
  }
  *o = 0;
  return t;
}

/* "label column not in the header" for a file cut by another delimiter:
 * say which one the header seems to use. */
static void delimiter_hint(const char *h, const char *hend, char delim,
                           char *out, size_t len) {
  static const char cand[] = {',', ';', '\t', '|'};
  out[0] = 0;
  for (size_t i = 0; i < sizeof cand; i++) {
    if (cand[i] == delim) continue;
    if (split_line(h, hend, cand[i], NULL, NULL, 0) > 1) {
      snprintf(out, len, "; the header has %lld column(s) with delimiter "
               "'%s' and %lld with '%s': set \"delimiter\": \"%s\"",
               (long long)split_line(h, hend, delim, NULL, NULL, 0),
               delim == '\t' ? "\\t" : (char[2]){delim, 0},
               (long long)split_line(h, hend, cand[i], NULL, NULL, 0),
               cand[i] == '\t' ? "\\t" : (char[2]){cand[i], 0},
               cand[i] == '\t' ? "\\t" : (char[2]){cand[i], 0});
      return;
    }
  }
}

/* Decimal numbers of up to 15 significant digits with a small exponent
 * are exact as mantissa * 10^e in double arithmetic (Clinger's fast path),
 * so they skip strtod; everything else goes through strtod. */
static const double pow10_tab[23] = {
    1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
    1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

static int fast_number(const char *a, const char *b, double *out) {
  const char *p = a;
  bool neg = false;
  if (p < b && (*p == '-' || *p == '+')) neg = *p++ == '-';
  uint64_t m = 0;
  int digits = 0, frac = 0;
  const char *d0 = p;
  while (p < b && *p >= '0' && *p <= '9') {
    if (m || *p != '0') digits++;
    m = m * 10 + (uint64_t)(*p++ - '0');
  }
  bool any = p > d0;
  if (p < b && *p == '.') {
    p++;
    const char *f0 = p;
    while (p < b && *p >= '0' && *p <= '9') {
      if (m || *p != '0') digits++;
      m = m * 10 + (uint64_t)(*p++ - '0');
      frac++;
    }
    any = any || p > f0;
  }
  if (!any || digits > 15) return -1;
  int e = 0;
  if (p < b && (*p == 'e' || *p == 'E')) {
    p++;
    bool eneg = false;
    if (p < b && (*p == '-' || *p == '+')) eneg = *p++ == '-';
    const char *e0 = p;
    while (p < b && *p >= '0' && *p <= '9' && e < 1000) e = e * 10 + (*p++ - '0');
    if (p == e0) return -1;
    if (eneg) e = -e;
  }
  if (p != b) return -1;
  e -= frac;
  double v = (double)m;
  if (e < -22 || e > 22) return -1;
  v = e < 0 ? v / pow10_tab[-e] : v * pow10_tab[e];
  *out = neg ? -v : v;
  return 0;
}

/* 0, -1 (not a number) or -2 (a number float32 cannot hold). */
static int parse_cell(const char *a, const char *b, float *out) {
  trim(&a, &b);
  double v;
  if (a < b && fast_number(a, b, &v) == 0) {
    if (!(fabs(v) <= FLT_MAX)) return -2;
    *out = (float)v;
    return 0;
  }
  char tmp[64];
  if (a == b || (size_t)(b - a) >= sizeof tmp) return -1;
  memcpy(tmp, a, (size_t)(b - a)); /* cells are not NUL-terminated */
  tmp[b - a] = 0;
  char *e;
  v = strtod(tmp, &e);
  if (e != tmp + (b - a) || isnan(v)) return -1;
  if (!(fabs(v) <= FLT_MAX)) return -2;
  *out = (float)v;
  return 0;
}

int wk_read__csv(const char *path, const wk_input_spec *spec, wk_table *out,
                 char *err, size_t errlen) {
  uint8_t *buf = NULL;
  size_t len = 0;
  const char **ca = NULL, **cb = NULL;
  int64_t *col = NULL;
  int rc = wk_read__slurp(path, &buf, &len, err, errlen);
  if (rc) return rc;
  memset(out, 0, sizeof *out);
  const char *p = (const char *)buf, *end = p + len;
  const char delim = spec->delimiter ? spec->delimiter : ',';
  int64_t hlines;
  bool open;
  const char *hend = record_end(p, end, &hlines, &open);
  const char *nl = hend < end ? hend : NULL;
  char **names = NULL;
  if (hend == p || len == 0) {
    rc = tsr_errf(err, errlen, TSR_EFORMAT,
                  "%s: empty file (a CSV needs a header line)", path);
    goto out;
  }
  if (open) {
    rc = tsr_errf(err, errlen, TSR_EFORMAT,
                  "%s: the header opens a quote that never closes",
                  path);
    goto out;
  }
  int64_t ncol = split_line(p, hend, delim, NULL, NULL, 0);
  ca = calloc((size_t)ncol, sizeof *ca);
  cb = calloc((size_t)ncol, sizeof *cb);
  col = calloc((size_t)ncol + 1, sizeof *col);
  names = calloc((size_t)ncol, sizeof *names);
  if (!ca || !cb || !col || !names) {
    rc = TSR_ENOMEM;
    goto out;
  }
  split_line(p, hend, delim, ca, cb, ncol);
  for (int64_t c = 0; c < ncol; c++)
    if (!(names[c] = cell_text(ca[c], cb[c]))) {
      rc = TSR_ENOMEM;
      goto out;
    }

  /* label column and feature columns */
  int64_t label = -1;
  for (int64_t c = 0; c < ncol; c++)
    if (!strcmp(names[c], spec->label)) label = c;
  if (label < 0) {
    char hint[160];
    delimiter_hint(p, hend, delim, hint, sizeof hint);
    rc = tsr_errf(err, errlen, TSR_ENOTFOUND,
                  "%s: label column \"%s\" (%s.label) is not in the "
                  "header%s",
                  path, spec->label, spec->where, hint);
    goto out;
  }
  int64_t d = 0;
  if (spec->dense) {
    for (int i = 0; i < spec->n_dense; i++) {
      int64_t found = -1;
      for (int64_t c = 0; c < ncol; c++)
        if (!strcmp(names[c], spec->dense[i].name)) found = c;
      if (found < 0) {
        rc = tsr_errf(err, errlen, TSR_ENOTFOUND,
                      "%s: feature column \"%s\" (%s.features[%d]) is "
                      "not in the header",
                      path, spec->dense[i].name, spec->where, i);
        goto out;
      }
      col[d++] = found;
    }
  } else {
    for (int64_t c = 0; c < ncol; c++)
      if (c != label) col[d++] = c;
  }
  out->d = d;
  out->names = calloc((size_t)(d ? d : 1), sizeof *out->names);
  if (!out->names) {
    rc = TSR_ENOMEM;
    goto out;
  }
  for (int64_t j = 0; j < d; j++) {
    out->names[j] = strdup(names[col[j]]);
    if (!out->names[j]) {
      rc = TSR_ENOMEM;
      goto out;
    }
  }

  /* rows: count lines for the allocation */
  int64_t nlines = 0;
  for (const char *q = hend; q < end; q++) nlines += *q == '\n';
  int64_t cap = nlines + 1;
  out->x = malloc((size_t)(cap * (d ? d : 1)) * sizeof(float));
  out->y = malloc((size_t)cap * sizeof(float));
  if (!out->x || !out->y) {
    rc = TSR_ENOMEM;
    goto out;
  }
  int64_t line = 1 + hlines, row = 0;
  const char *q = nl ? nl + 1 : end;
  while (q < end) {
    int64_t inner;
    const char *le = record_end(q, end, &inner, &open);
    line++;
    if (open) {
      rc = tsr_errf(err, errlen, TSR_EFORMAT,
                    "%s: line %lld (data row %lld) opens a quote that "
                    "never closes", path, (long long)line,
                    (long long)row);
      goto out;
    }
    const char *a = q, *b = le;
    trim(&a, &b);
    if (a == b) { /* blank: allowed only at the end of the file */
      const char *r = le;
      while (r < end && (*r == '\n' || *r == '\r' || *r == ' ' || *r == '\t'))
        r++;
      if (r != end) {
        rc = tsr_errf(err, errlen, TSR_EFORMAT,
                      "%s: line %lld is blank (ragged: %lld cells "
                      "expected)",
                      path, (long long)line, (long long)ncol);
        goto out;
      }
      break;
    }
    int64_t n = split_line(q, le, delim, ca, cb, ncol);
    if (n != ncol) {
      rc = tsr_errf(err, errlen, TSR_EFORMAT,
                    "%s: line %lld (data row %lld) has %lld cells, the "
                    "header has %lld (ragged rows)",
                    path, (long long)line, (long long)row, (long long)n,
                    (long long)ncol);
      goto out;
    }
    for (int64_t j = 0; j <= d; j++) {
      int64_t c = j < d ? col[j] : label;
      float *dst = j < d ? &out->x[row * d + j] : &out->y[row];
      int pc = parse_cell(ca[c], cb[c], dst);
      if (pc != 0) {
        const char *ta = ca[c], *tb = cb[c];
        trim(&ta, &tb);
        rc = tsr_errf(err, errlen, TSR_EFORMAT,
                      "%s: line %lld (data row %lld), column %lld "
                      "(\"%s\"): \"%.*s\" %s",
                      path, (long long)line, (long long)row,
                      (long long)c + 1, names[c],
                      (int)(tb - ta > 60 ? 60 : tb - ta), ta,
                      pc == -2 ? "overflows float32" : "is not a number");
        goto out;
      }
    }
    row++;
    line += inner;
    q = le < end ? le + 1 : end;
  }
  out->n = row;
out:
  for (int64_t c = 0; names && c < ncol; c++) free(names[c]);
  free(names);
  free(ca);
  free(cb);
  free(col);
  free(buf);
  if (rc) wk_table__free(out);
  return rc;
}
