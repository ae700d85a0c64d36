/* Internals of the job file shared by job.c (reading, overrides, the
 * partitioner) and job_keys.c (the key table's rows and their readers),
 * and by the tests that check the table against the README. */
#ifndef TSR_JOB_INT_H
#define TSR_JOB_INT_H

#include "common/job.h"

#include <stddef.h>
#include <stdint.h>

typedef enum {
  TSR__JK_INT,  /* an integer in [lo, hi] into an int64_t or int member */
  TSR__JK_SECS, /* a finite number >= 0 into a double member */
  TSR__JK_PATH, /* a string (null: unset) into a char * member */
  TSR__JK_FN,   /* read by fn */
  TSR__JK_NOTE  /* accepted, not read */
} tsr__jk_kind;

typedef struct tsr__jk_row tsr__jk_row;

/* Reads `v` (present, maybe null) into `job`; `where` is the key's path
 * ("checkpoint"); `base_dir` resolves relative paths (may be NULL). */
typedef int tsr__jk_reader(tsr_job *job, json_t *v, const char *where,
                           const char *base_dir, const tsr__jk_row *row,
                           char *err, size_t errlen);
typedef tsr__jk_reader *tsr__jk_fn;

/* One row of TSR_JOB_KEYS (job_keys.h). */
struct tsr__jk_row {
  const char *key;
  tsr__jk_kind kind;
  size_t off, size;        /* INT, SECS, PATH: the member of tsr_job */
  int64_t lo, hi;          /* INT */
  tsr__jk_fn fn;           /* FN */
  const char *type;        /* FN, NOTE: what the value is, in words */
  const tsr__jk_row *sub;  /* an object's own keys (OBJ), else NULL */
  size_t nsub;
  const char *def, *doc;
};

/* The top-level keys, in the order they are read. */
extern const tsr__jk_row tsr__job_keys[];
extern const size_t tsr__job_nkeys;

/* Checks the keys of `obj` against `rows` (unknown ones named) and reads
 * each one present, in the rows' order. */
int tsr__jk_read(tsr_job *job, json_t *obj, const char *where,
                 const tsr__jk_row *rows, size_t n, const char *base_dir,
                 char *err, size_t errlen);

/* `obj`.`key`, when present, as an integer in [lo, hi]; errors name
 * "where.key". */
int tsr__jk_get_int(json_t *obj, const char *where, const char *key,
                    int64_t *out, int64_t lo, int64_t hi, char *err,
                    size_t errlen);

/* The value's type in words, for the README ("integer 1..16777216"). */
void tsr__jk_type(const tsr__jk_row *r, char *buf, size_t len);

#endif /* TSR_JOB_INT_H */
