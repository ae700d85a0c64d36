/* Strict walking of JSON configuration (job file, data spec, optimizer,
 * built-in models): a key nobody reads is an error that names it, with the
 * closest known key when one is near, so a typo never passes silently.
 *
 * Happy path: tsr_conf_check_keys(obj, "optimizer", keys, NULL, ...)
 * before reading the keys. Failure modes: TSR_ECONFIG with
 * "optimizer.beta1: unknown key; did you mean \"beta_1\"?", or, when no
 * known key is within two edits, the known keys listed (when they fit).
 * Pure; any thread.
 */
#ifndef TSR_CONF_H
#define TSR_CONF_H

#include <jansson.h>
#include <stddef.h>

/* Fails on the first key of `obj` that is in neither NULL-terminated list
 * (`more` may be NULL). `where` is the object's path ("" for the top). */
int tsr_conf_check_keys(const json_t *obj, const char *where,
                        const char *const *known, const char *const *more,
                        char *err, size_t errlen);

/* The error for one unknown key, as tsr_conf_check_keys words it. */
int tsr_conf_unknown_key(const char *where, const char *key,
                         const char *const *known, const char *const *more,
                         char *err, size_t errlen);

/* Levenshtein distance of two short strings (99 past 40 characters), for
 * the "did you mean" of unknown keys. */
int tsr_edit_distance(const char *a, const char *b);

#endif /* TSR_CONF_H */
