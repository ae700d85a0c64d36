/* Scalar series kept in memory for report.html and the summary.
 *
 * Points are appended per tag in arrival order; tags keep the order in
 * which they first appeared, so the report lists them as the run produced
 * them. Loading metrics.jsonl parses one JSON object per line
 * ({"wall_time", "step", "tag", "value"}); a malformed line is an error
 * that names the file and line, and stops the load.
 */
#include "artifacts/monitor/monitor.h"
#include "common/err.h"
#include "common/grow.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void chief_series_init(chief_series_set *set) { memset(set, 0, sizeof *set); }

void chief_series_free(chief_series_set *set) {
  for (size_t i = 0; i < set->n; i++) {
    free(set->s[i].tag);
    free(set->s[i].pts);
  }
  free(set->s);
  memset(set, 0, sizeof *set);
}

const chief_series *chief_series_find(const chief_series_set *set,
                                      const char *tag) {
  for (size_t i = 0; i < set->n; i++)
    if (strcmp(set->s[i].tag, tag) == 0) return &set->s[i];
  return NULL;
}

int chief_series_add(chief_series_set *set, const char *tag, int64_t step,
                     double value, double wall_time) {
  chief_series *s = (chief_series *)chief_series_find(set, tag);
  if (!s) {
    if (tsr_grow(&set->s, &set->cap, set->n, sizeof *set->s, 16))
      return TSR_ENOMEM;
    char *t = strdup(tag);
    if (!t) return TSR_ENOMEM;
    s = &set->s[set->n++];
    memset(s, 0, sizeof *s);
    s->tag = t;
  }
  if (tsr_grow(&s->pts, &s->cap, s->n, sizeof *s->pts, 64))
    return TSR_ENOMEM;
  s->pts[s->n++] = (chief_point){
      .step = step, .value = isfinite(value) ? value : NAN,
      .wall_time = wall_time};
  return 0;
}

void chief_series_purge_after(chief_series_set *set, int64_t step) {
  for (size_t i = 0; i < set->n; i++) {
    chief_series *s = &set->s[i];
    size_t k = 0;
    for (size_t j = 0; j < s->n; j++)
      if (s->pts[j].step <= step) s->pts[k++] = s->pts[j];
    s->n = k;
  }
}

int chief_series_load_jsonl(chief_series_set *set, const char *path,
                            char *err, size_t errlen) {
  FILE *f = fopen(path, "re");
  if (!f) {
    int e = errno;
    snprintf(err, errlen, "cannot open %s: %s", path, strerror(e));
    return -e;
  }
  char *line = NULL;
  size_t cap = 0;
  ssize_t n;
  long lineno = 0;
  int rc = 0;
  while ((n = getline(&line, &cap, f)) >= 0) {
    lineno++;
    while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
      line[--n] = '\0';
    if (n == 0) continue;
    json_error_t jerr;
    json_t *o = json_loadb(line, (size_t)n, 0, &jerr);
    if (!o) {
      snprintf(err, errlen, "%s:%ld: malformed JSON: %s", path, lineno,
               jerr.text);
      rc = TSR_EJSON;
      break;
    }
    json_t *event = json_object_get(o, "event");
    if (json_is_string(event) &&
        !strcmp(json_string_value(event), "session_start")) {
      json_t *st = json_object_get(o, "step");
      if (!json_is_integer(st)) {
        snprintf(err, errlen, "%s:%ld: session_start without an integer "
                 "\"step\"", path, lineno);
        json_decref(o);
        rc = TSR_EFORMAT;
        break;
      }
      chief_series_purge_after(set, json_integer_value(st));
      json_decref(o);
      continue;
    }
    json_t *tag = json_object_get(o, "tag");
    json_t *step = json_object_get(o, "step");
    json_t *val = json_object_get(o, "value");
    json_t *wall = json_object_get(o, "wall_time");
    const char *bad = !json_is_object(o)          ? "the line"
                      : !json_is_string(tag)      ? "\"tag\""
                      : !json_is_integer(step)    ? "\"step\""
                      : !(json_is_number(val) || json_is_null(val))
                          ? "\"value\""
                      : !(wall == NULL || json_is_number(wall))
                          ? "\"wall_time\""
                          : NULL;
    if (bad) {
      snprintf(err, errlen, "%s:%ld: %s is missing or has the wrong type",
               path, lineno, bad);
      json_decref(o);
      rc = TSR_EFORMAT;
      break;
    }
    rc = chief_series_add(set, json_string_value(tag),
                          json_integer_value(step),
                          json_is_null(val) ? NAN : json_number_value(val),
                          wall ? json_number_value(wall) : 0);
    json_decref(o);
    if (rc) {
      snprintf(err, errlen, "%s:%ld: %s", path, lineno, tsr_strerror(rc));
      break;
    }
  }
  free(line);
  fclose(f);
  return rc;
}
