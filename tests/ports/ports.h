/* Ports for tests whose processes bind them later: a test claims ports
 * for the whole of its life, so that a PS it kills and starts again on the
 * same port finds the port still free, whatever other tests run beside it.
 *
 * The rule (one for the shell tests, through tsr-test-ports, and the C
 * tests, through these calls):
 *  - ports come from the block 20000-32767 (TSR_TEST_PORTS=LO-HI instead,
 *    for the mechanism's own test), less the kernel's ephemeral range
 *    (/proc/sys/net/ipv4/ip_local_port_range): the kernel never hands out
 *    a port of the block for a bind to port 0 or an outgoing connection,
 *    so only a claimer binds it; at random within it;
 *  - a claim is the file DIR/<port> holding "PID STARTTIME" of its owner
 *    (DIR: TSR_TEST_PORT_DIR, else /tmp/tessera-test-ports; not $TMPDIR,
 *    which tests point at folders of their own); every claim and release
 *    holds an flock on DIR/.lock, so two pickers never take one port;
 *  - a port is claimed only when nobody holds a claim on it and it binds
 *    on 0.0.0.0 and [::];
 *  - a claim whose owner is gone (no such PID, or the PID now belongs to a
 *    process started at another time) is stale: the next picker that
 *    meets it takes it over, so a test killed with -9 leaks nothing for
 *    good;
 *  - the owner releases its claims when it ends (the shell tests' cleanup,
 *    the C tests' teardown).
 * Errors: 0 or a negative errno value, with a line naming the problem in
 * err. */
#ifndef TSR_TEST_PORTS_H
#define TSR_TEST_PORTS_H

#include <stddef.h>

/* The default block; see above for why it ends below the ephemeral
 * range. */
#define TEST_PORTS_LO 20000
#define TEST_PORTS_HI 32767

/* Claims n distinct ports for the process `owner` (which must be
 * running), into ports[0..n-1]; with `run`, n consecutive ports whose
 * first is a multiple of n (a block a script derives its ports from).
 * All or nothing: on failure nothing stays claimed. */
int test_ports_claim(int n, int run, long owner, int *ports, char *err,
                     size_t errlen);

/* Releases the claims of `owner` on ports[0..n-1], or every claim of
 * `owner` when n is 0; a claim held by another process is left alone.
 * Returns how many were released, or a negative errno value. */
int test_ports_release(long owner, const int *ports, int n, char *err,
                       size_t errlen);

/* One port claimed for this process; aborts with a line naming the
 * problem when none can be claimed (a test cannot go on without it). */
int test_port(void);

#endif
