/* Command-line options of every Tessera program (tessera-ps,
 * tessera-worker, tessera-chief and the `tessera` commands): a table that
 * gives each option's name, kind and where its value goes, read by one
 * parser, so that every program takes its options the same way and says
 * the same thing about a bad one.
 *
 * Happy path: the program lists its options as TSR_ARG_* entries ending
 * with TSR_ARG_END and calls tsr_arg_parse(); each value lands where its
 * entry points, in the order given (a repeated option: the last value
 * wins; a callback is called for each). Taken as GNU getopt_long takes
 * them: --NAME VALUE or --NAME=VALUE (a VALUE may begin with a dash), a
 * prefix that names one option only (--clu for --cluster), positional
 * arguments anywhere, "--" ending the options; --help and -h print the
 * usage on stdout.
 * Failure modes: an unknown or ambiguous option, a missing value, a value
 * given to an option that takes none, a number that is not one or lies
 * out of its range, a name not among the choices, a callback's refusal,
 * a positional argument where the program takes none: one line naming
 * the option and the value ("tessera evaluate: --threads 0: must be a
 * whole number from 1 to 1024"; a log line for programs that log), the
 * usage on stderr after an unknown option or a missing value, and
 * TSR_EINVAL: the program exits 2. Values set before the bad one stay
 * set.
 *
 * Threads: any; no global state (unlike getopt's optind).
 */
#ifndef TSR_ARG_H
#define TSR_ARG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

typedef enum {
  TSR_ARG__END = 0,
  TSR_ARG__FLAG,   /* no value: the integer at `out` becomes 1 */
  TSR_ARG__STR,    /* const char *: the argument itself (not copied) */
  TSR_ARG__INT,    /* an integer of `size` bytes, from min to max */
  TSR_ARG__NUM,    /* double, from lo (or above it) to hi */
  TSR_ARG__CHOICE, /* the index of the value among `choices` */
  TSR_ARG__CALL    /* fn(out, "--NAME", value, err, errlen) */
} tsr_arg_kind;

/* A program's own reading of a value: 0, or a negative code with one line
 * in `err` naming `flag` and `value`. `data` is the entry's `out`. */
typedef int (*tsr_arg_fn)(void *data, const char *flag, const char *value,
                          char *err, size_t errlen);

typedef struct {
  const char *name; /* "threads" for --threads; NULL ends the table */
  tsr_arg_kind kind;
  void *out;                  /* where the value goes (by kind) */
  size_t size;                /* FLAG, INT, CHOICE: sizeof *out */
  long long min, max;         /* INT: the range, both included */
  double lo, hi;              /* NUM: the range */
  bool above;                 /* NUM: lo itself is refused */
  const char *const *choices; /* CHOICE: NULL-terminated */
  tsr_arg_fn fn;              /* CALL */
  bool *seen;                 /* if set: becomes true when given */
} tsr_arg;

/* `p` points to an integer (or bool, or enum for CHOICE) of 1, 2, 4 or 8
 * bytes; the conditional expressions make the compiler check the
 * pointer types of STR and NUM. */
#define TSR_ARG_FLAG(name_, p)                                            \
  {.name = (name_), .kind = TSR_ARG__FLAG, .out = (p), .size = sizeof *(p)}
#define TSR_ARG_STR(name_, p)                                             \
  {.name = (name_), .kind = TSR_ARG__STR,                                 \
   .out = (void *)(1 ? (p) : (const char **)0)}
#define TSR_ARG_INT(name_, p, min_, max_)                                 \
  TSR_ARG_INT_SEEN(name_, p, min_, max_, NULL)
/* The same, and *seen_ true when given (a value of the whole range may
 * follow a default the program must tell apart). */
#define TSR_ARG_INT_SEEN(name_, p, min_, max_, seen_)                     \
  {.name = (name_), .kind = TSR_ARG__INT, .out = (p),                     \
   .size = sizeof *(p) + 0 * _Generic(*(p), int: 0, long: 0,              \
                                      long long: 0, unsigned: 0,          \
                                      unsigned long: 0,                   \
                                      unsigned long long: 0),             \
   .min = (min_), .max = (max_), .seen = (seen_)}
/* lo and hi both accepted; -INFINITY / INFINITY for no bound. */
#define TSR_ARG_NUM(name_, p, lo_, hi_)                                   \
  {.name = (name_), .kind = TSR_ARG__NUM,                                 \
   .out = (void *)(1 ? (p) : (double *)0), .lo = (lo_), .hi = (hi_)}
/* above lo (lo refused), up to hi */
#define TSR_ARG_NUM_ABOVE(name_, p, lo_, hi_)                             \
  {.name = (name_), .kind = TSR_ARG__NUM,                                 \
   .out = (void *)(1 ? (p) : (double *)0), .lo = (lo_), .hi = (hi_),      \
   .above = true}
#define TSR_ARG_CHOICE(name_, p, list)                                    \
  {.name = (name_), .kind = TSR_ARG__CHOICE, .out = (p),                  \
   .size = sizeof *(p), .choices = (list)}
#define TSR_ARG_CALL(name_, fn_, data)                                    \
  {.name = (name_), .kind = TSR_ARG__CALL, .out = (data), .fn = (fn_)}
#define TSR_ARG_END {.name = NULL}

/* The program, as its errors and its help name it. */
typedef struct {
  const char *name; /* "tessera-ps", "tessera partition": starts each
                     * error line on stderr */
  bool log;         /* errors as log lines (tsr_error) instead */
  bool pass;        /* unknown options are positional arguments (tessera
                     * local hands them to tessera-chief); then only whole
                     * names are known, never a prefix */
  void (*usage)(FILE *f, const void *data); /* the --help text */
  const void *data;                         /* for usage */
} tsr_arg_cmd;

/* tsr_arg_parse's answer when it printed the help: exit 0. */
#define TSR_ARG_HELP 1

/* Reads argv[1..argc) against `opts`. With n_args, the positional
 * arguments (and everything after "--") end up in argv[1..1 + *n_args),
 * in their order; without, any is an error. Returns 0, TSR_ARG_HELP, or
 * TSR_EINVAL with the error printed. */
int tsr_arg_parse(const tsr_arg_cmd *cmd, const tsr_arg *opts, int argc,
                  char **argv, int *n_args);

/* The exit status for a non-zero tsr_arg_parse() answer: 0 after the
 * help, 2 after an error. */
static inline int tsr_arg_status(int rc) { return rc == TSR_ARG_HELP ? 0 : 2; }

#endif /* TSR_ARG_H */
