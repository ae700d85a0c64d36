/* Command-line options (common/arg.h): each kind lands its value (flag,
 * string, whole number, number, choice, callback), --NAME=VALUE and a
 * unique prefix are taken, "--" and positional arguments end up in argv
 * in order; a value out of range, not a number, missing, given to a flag,
 * an unknown or ambiguous option and a positional argument where none is
 * taken are refused with TSR_EINVAL and one line that names the program,
 * the option and the value; --help prints the usage on stdout. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/arg.h"
#include "common/err.h"

typedef struct {
  bool flag;
  const char *str;
  int small;
  long long big;
  double num, above;
  int choice;
  char seen_calls[256];
} vals;

static int remember(void *data, const char *flag, const char *value,
                    char *err, size_t errlen) {
  vals *v = data;
  if (!strcmp(value, "no")) {
    snprintf(err, errlen, "%s %s: refused", flag, value);
    return TSR_EINVAL;
  }
  size_t n = strlen(v->seen_calls);
  snprintf(v->seen_calls + n, sizeof v->seen_calls - n, "%s=%s;", flag,
           value);
  return 0;
}

static int usage_out, usage_err; /* usage printed on stdout, on stderr */

static void usage(FILE *f, const void *data) {
  (void)data;
  if (f == stdout) usage_out++;
  if (f == stderr) usage_err++;
}

static const char *const colours[] = {"red", "green", "blue", NULL};

/* tsr_arg_parse over the words of `line` (after a program name), with
 * what it printed on stderr in `out`. */
static int parse(const tsr_arg_cmd *cmd, vals *v, bool *seen, int *n_args,
                 char **argv, const char *line, char *out, size_t outlen) {
  static char words[1024];
  snprintf(words, sizeof words, "%s", line);
  int argc = 0;
  argv[argc++] = "prog";
  for (char *save, *w = strtok_r(words, " ", &save); w;
       w = strtok_r(NULL, " ", &save))
    argv[argc++] = w;
  argv[argc] = NULL;
  const tsr_arg opts[] = {
      TSR_ARG_FLAG("flag", &v->flag),
      TSR_ARG_STR("str", &v->str),
      TSR_ARG_INT("small", &v->small, 1, 256),
      TSR_ARG_INT_SEEN("big", &v->big, LLONG_MIN, LLONG_MAX, seen),
      TSR_ARG_NUM("num", &v->num, 0.5, INFINITY),
      TSR_ARG_NUM_ABOVE("above", &v->above, 0, 3600),
      TSR_ARG_CHOICE("colour", &v->choice, colours),
      TSR_ARG_CALL("call", remember, v),
      TSR_ARG_STR("call-me", &v->str),
      TSR_ARG_END};
  FILE *tmp = tmpfile();
  assert_non_null(tmp);
  fflush(stderr);
  int saved = dup(2);
  dup2(fileno(tmp), 2);
  usage_out = usage_err = 0;
  int rc = tsr_arg_parse(cmd, opts, argc, argv, n_args);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  rewind(tmp);
  size_t n = fread(out, 1, outlen - 1, tmp);
  out[n] = 0;
  fclose(tmp);
  return rc;
}

static const tsr_arg_cmd prog = {.name = "prog", .usage = usage};

static void each_kind_lands(void **state) {
  (void)state;
  vals v = {.choice = -1};
  bool seen = false;
  char *argv[32], out[1024];
  assert_int_equal(parse(&prog, &v, &seen, NULL, argv,
                         "--flag --str s --small=256 --big -7 --num 0.5 "
                         "--above 3600 --colour blue --call a --call=b",
                         out, sizeof out),
                   0);
  assert_string_equal(out, "");
  assert_true(v.flag);
  assert_string_equal(v.str, "s");
  assert_int_equal(v.small, 256);
  assert_true(v.big == -7);
  assert_true(seen);
  assert_true(v.num == 0.5);
  assert_true(v.above == 3600);
  assert_int_equal(v.choice, 2);
  assert_string_equal(v.seen_calls, "--call=a;--call=b;");
  /* a prefix of one name only, and a whole name that begins another */
  vals w = {0};
  seen = false;
  assert_int_equal(parse(&prog, &w, &seen, NULL, argv,
                         "--fl --sm 1 --call x --col red", out, sizeof out),
                   0);
  assert_true(w.flag);
  assert_int_equal(w.small, 1);
  assert_false(seen);
  assert_string_equal(w.seen_calls, "--call=x;");
  assert_int_equal(w.choice, 0);
}

/* Each refusal: TSR_EINVAL and the line it prints, whole. */
static void bad_values_are_named(void **state) {
  (void)state;
  static const struct {
    const char *line, *want;
    int usage_err;
  } cases[] = {
      {"--small 0", "prog: --small 0: must be a whole number from 1 to 256\n",
       0},
      {"--small 257", "prog: --small 257: must be a whole number from 1 to "
       "256\n", 0},
      {"--small 2x", "prog: --small 2x: must be a whole number from 1 to "
       "256\n", 0},
      {"--small=", "prog: --small : must be a whole number from 1 to 256\n",
       0},
      {"--big 99999999999999999999", "prog: --big 99999999999999999999: "
       "must be a whole number\n", 0},
      {"--num 0.4", "prog: --num 0.4: must be a number of at least 0.5\n", 0},
      {"--num nan", "prog: --num nan: must be a number of at least 0.5\n", 0},
      {"--above 0", "prog: --above 0: must be a number above 0 and at most "
       "3600\n", 0},
      {"--above 3601", "prog: --above 3601: must be a number above 0 and at "
       "most 3600\n", 0},
      {"--above 1s", "prog: --above 1s: must be a number above 0 and at most "
       "3600\n", 0},
      {"--colour tpu", "prog: --colour tpu: must be red, green or blue\n", 0},
      {"--call no", "prog: --call no: refused\n", 0},
      {"--flag=1", "prog: --flag takes no value\n", 0},
      {"--str", "prog: --str needs a value\n", 1},
      {"--bogus 1", "prog: unknown option \"--bogus\"\n", 1},
      {"-x", "prog: unknown option \"-x\"\n", 1},
      {"--ca x", "prog: ambiguous option \"--ca\"\n", 1},
      {"--flag stray", "prog: unexpected argument \"stray\"\n", 0},
      {"-- --flag", "prog: unexpected argument \"--flag\"\n", 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    vals v = {0};
    bool seen = false;
    char *argv[32], out[1024];
    int rc = parse(&prog, &v, &seen, NULL, argv, cases[i].line, out,
                   sizeof out);
    if (rc != TSR_EINVAL || strcmp(out, cases[i].want))
      fail_msg("\"%s\": rc %d, printed \"%s\", want \"%s\"", cases[i].line,
               rc, out, cases[i].want);
    assert_int_equal(usage_err, cases[i].usage_err);
    assert_int_equal(usage_out, 0);
    assert_int_equal(tsr_arg_status(rc), 2);
  }
}

static void positional_and_double_dash(void **state) {
  (void)state;
  vals v = {0};
  bool seen = false;
  char *argv[32], out[1024];
  int n = -1;
  assert_int_equal(parse(&prog, &v, &seen, &n, argv,
                         "a --flag b - --small 3 -- --str c", out, sizeof out),
                   0);
  assert_int_equal(n, 5);
  assert_string_equal(argv[1], "a");
  assert_string_equal(argv[2], "b");
  assert_string_equal(argv[3], "-");
  assert_string_equal(argv[4], "--str");
  assert_string_equal(argv[5], "c");
  assert_true(v.flag);
  assert_int_equal(v.small, 3);
  assert_null(v.str);
  /* a value may begin with a dash */
  assert_int_equal(parse(&prog, &v, &seen, &n, argv, "--str -- --big -1",
                         out, sizeof out),
                   0);
  assert_string_equal(v.str, "--");
  assert_true(v.big == -1 && seen);
  assert_int_equal(n, 0);
}

static void pass_leaves_unknown_options(void **state) {
  (void)state;
  static const tsr_arg_cmd pass = {.name = "prog", .pass = true,
                                   .usage = usage};
  vals v = {0};
  bool seen = false;
  char *argv[32], out[1024];
  int n = -1;
  assert_int_equal(parse(&pass, &v, &seen, &n, argv,
                         "--job x.json --small 4 --fl -q --steps=5 -- --small 9",
                         out, sizeof out),
                   0);
  assert_string_equal(out, "");
  assert_int_equal(v.small, 4);
  assert_false(v.flag); /* no prefixes: --fl is someone else's */
  assert_int_equal(n, 7);
  const char *want[] = {"--job", "x.json", "--fl", "-q", "--steps=5",
                        "--small", "9"};
  for (int i = 0; i < n; i++) assert_string_equal(argv[1 + i], want[i]);
}

static void help_and_log_lines(void **state) {
  (void)state;
  vals v = {0};
  bool seen = false;
  char *argv[32], out[1024];
  for (int i = 0; i < 3; i++) {
    const char *line[] = {"--help", "-h --bogus", "--he"};
    int rc = parse(&prog, &v, &seen, NULL, argv, line[i], out, sizeof out);
    assert_int_equal(rc, TSR_ARG_HELP);
    assert_int_equal(tsr_arg_status(rc), 0);
    assert_int_equal(usage_out, 1);
    assert_string_equal(out, "");
  }
  /* a program that logs: the error is a log line naming the same */
  static const tsr_arg_cmd logs = {.name = "prog", .log = true};
  int rc = parse(&logs, &v, &seen, NULL, argv, "--small 0", out, sizeof out);
  assert_int_equal(rc, TSR_EINVAL);
  assert_non_null(strstr(out, "ERROR"));
  assert_non_null(strstr(out, "--small 0: must be a whole number from 1 to "
                              "256\n"));
  assert_null(strstr(out, "prog: "));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(each_kind_lands),
      cmocka_unit_test(bad_values_are_named),
      cmocka_unit_test(positional_and_double_dash),
      cmocka_unit_test(pass_leaves_unknown_options),
      cmocka_unit_test(help_and_log_lines),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
