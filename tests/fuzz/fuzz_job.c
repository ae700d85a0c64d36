/* libFuzzer target: the job file parser (common/job.c).
 *
 * The input is a job file's text; after a first NUL byte, the rest is a
 * list of "key=value" overrides (NUL-separated) as the chief's --set
 * flags give them. Any text must be either parsed into a job or refused
 * with an error message; nothing may crash or leak. A parsed job is then
 * turned into a model (worker/model.c) as the chief does. */
#include "common/job.h"
#include "common/log.h"
#include "worker/model.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  tsr_log_set_level(TSR_LOG_ERROR); /* a plain store: cheap per input */
  char *text = malloc(size + 1);
  if (!text) return 0;
  memcpy(text, data, size);
  text[size] = 0;
  /* overrides after the first NUL */
  const char *ov[9] = {0};
  size_t tl = strlen(text), at = tl + 1;
  for (int k = 0; k < 8 && at < size; k++) {
    ov[k] = text + at;
    at += strlen(text + at) + 1;
  }
  tsr_job job;
  tsr_job_init(&job);
  char err[512];
  if (tsr_job_parse(text, "fuzz", NULL, ov[0] ? ov : NULL, &job, err,
                    sizeof err) == 0) {
    tsr_model *m;
    if (tsr_model_from_job(&job, NULL, &m, err, sizeof err) == 0)
      tsr_model_free(m);
  } else if (!err[0]) {
    abort(); /* refused without saying why */
  }
  tsr_job_free(&job);
  free(text);
  return 0;
}
