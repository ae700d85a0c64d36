/* The config.json of a .keras archive as the exporter writes it (stored
 * members, artifacts/weights/npz.h) and its layers, for the Keras export
 * tests (cmocka: a missing file, member or layer fails the test). */
#ifndef TSR_TEST_KERAS_ARCHIVE_H
#define TSR_TEST_KERAS_ARCHIVE_H

#include "../tmpdir.h"

#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

static inline json_t *test_keras_config(const char *path) {
  size_t len = 0;
  char *buf = test_slurp(path, &len);
  assert_non_null(buf);
  const uint8_t *b = (const uint8_t *)buf;
  json_t *out = NULL;
  for (size_t at = 0; at + 30 < len && !out;) {
    assert_true(b[at] == 'P' && b[at + 1] == 'K');
    size_t csz = b[at + 18] | b[at + 19] << 8 | (size_t)b[at + 20] << 16 |
                 (size_t)b[at + 21] << 24;
    size_t nl = b[at + 26] | b[at + 27] << 8, xl = b[at + 28] | b[at + 29] << 8;
    if (nl == 11 && !memcmp(buf + at + 30, "config.json", 11)) {
      json_error_t je;
      out = json_loadb(buf + at + 30 + nl + xl, csz, 0, &je);
    }
    at += 30 + nl + xl + csz;
  }
  free(buf);
  assert_non_null(out);
  return out;
}

/* The layer of that config whose config.name is `name`. */
static inline const json_t *test_keras_layer(const json_t *cfg,
                                             const char *name) {
  const json_t *ls = json_object_get(json_object_get(cfg, "config"), "layers");
  for (size_t i = 0; i < json_array_size(ls); i++) {
    const json_t *l = json_array_get(ls, i);
    const char *n = json_string_value(
        json_object_get(json_object_get(l, "config"), "name"));
    if (n && !strcmp(n, name)) return l;
  }
  fail_msg("no layer %s in the config", name);
  return NULL;
}

#endif
