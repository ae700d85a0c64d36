/* Port claims for tests (ports.h): the block, the claim files, the check
 * that a port binds, stale claims taken over. */
#include "ports.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define TP_DIR "/tmp/tessera-test-ports"
/* The kernel's default, where /proc cannot say (no procfs mounted). */
#define TP_EPH_LO 32768
#define TP_EPH_HI 60999

typedef struct {
  int lo, hi;
} tp_range;

static const char *tp_dir(void) {
  const char *d = getenv("TSR_TEST_PORT_DIR");
  return d && *d ? d : TP_DIR;
}

static int tp_ephemeral(tp_range *r) {
  r->lo = TP_EPH_LO;
  r->hi = TP_EPH_HI;
  FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
  if (!f) return 0;
  int lo, hi;
  if (fscanf(f, "%d %d", &lo, &hi) == 2 && lo > 0 && hi >= lo) {
    r->lo = lo;
    r->hi = hi;
  }
  fclose(f);
  return 0;
}

/* The block ports are drawn from: TSR_TEST_PORTS=LO-HI, else the
 * default. */
static int tp_block(tp_range *b, char *err, size_t errlen) {
  const char *s = getenv("TSR_TEST_PORTS");
  b->lo = TEST_PORTS_LO;
  b->hi = TEST_PORTS_HI;
  if (!s || !*s) return 0;
  int lo, hi, used = 0;
  if (sscanf(s, "%d-%d%n", &lo, &hi, &used) != 2 || s[used] != 0 ||
      lo < 1024 || hi > 65535 || lo > hi) {
    snprintf(err, errlen,
             "TSR_TEST_PORTS \"%s\": expected LO-HI with 1024 <= LO <= HI "
             "<= 65535", s);
    return -EINVAL;
  }
  b->lo = lo;
  b->hi = hi;
  return 0;
}

/* When the process `pid` started (field 22 of /proc/PID/stat, clock
 * ticks since boot); 0 when there is no such process. */
static unsigned long long tp_start_time(long pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%ld/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  /* the name (field 2) may hold spaces and ')': fields 3.. follow the
   * last ')' */
  char *p = strrchr(buf, ')');
  if (!p) return 0;
  p++;
  for (int field = 2; field < 21 && p; field++) p = strchr(p + 1, ' ');
  unsigned long long t = 0;
  if (!p || sscanf(p, " %llu", &t) != 1) return 0;
  return t;
}

/* The claim file of `port`: its owner, or 0 when there is no claim (or
 * one a claimer killed mid-write left empty). */
static long tp_read_claim(const char *dir, int port,
                          unsigned long long *start) {
  char path[4200];
  snprintf(path, sizeof path, "%s/%d", dir, port);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  long pid = 0;
  if (fscanf(f, "%ld %llu", &pid, start) != 2) pid = 0;
  fclose(f);
  return pid;
}

static int tp_alive(long pid, unsigned long long start) {
  return pid > 0 && tp_start_time(pid) == start;
}

static int tp_binds(int family, int port) {
  int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno == EAFNOSUPPORT; /* no IPv6 here */
  int rc;
  if (family == AF_INET) {
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    rc = bind(fd, (struct sockaddr *)&a, sizeof a);
  } else {
    int one = 1;
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    struct sockaddr_in6 a = {.sin6_family = AF_INET6,
                             .sin6_port = htons((uint16_t)port),
                             .sin6_addr = IN6ADDR_ANY_INIT};
    rc = bind(fd, (struct sockaddr *)&a, sizeof a);
  }
  int ok = rc == 0 || errno == EADDRNOTAVAIL; /* IPv6 turned off */
  close(fd);
  return ok;
}

/* Claims `port` for owner (pid, start) when it is free: 1 taken, 0 not,
 * negative on an error writing the claim. The caller holds the lock. */
static int tp_take(const char *dir, int port, long pid,
                   unsigned long long start) {
  char path[4200];
  snprintf(path, sizeof path, "%s/%d", dir, port);
  unsigned long long their = 0;
  long holder = tp_read_claim(dir, port, &their);
  if (holder && tp_alive(holder, their)) return 0;
  if (unlink(path) != 0 && errno != ENOENT) return 0; /* not ours to take */
  if (!tp_binds(AF_INET, port) || !tp_binds(AF_INET6, port)) return 0;
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return -errno;
  char line[64];
  int len = snprintf(line, sizeof line, "%ld %llu\n", pid, start);
  int rc = write(fd, line, (size_t)len) == len ? 1 : -EIO;
  if (close(fd) != 0 && rc == 1) rc = -errno;
  if (rc < 0) unlink(path);
  return rc;
}

static void tp_drop(const char *dir, const int *ports, int n) {
  char path[4200];
  for (int i = 0; i < n; i++) {
    snprintf(path, sizeof path, "%s/%d", dir, ports[i]);
    unlink(path);
  }
}

/* Opens DIR (made on first use, open to every user like /tmp) and takes
 * its lock: the lock's fd, or a negative errno value. */
static int tp_lock(const char *dir, char *err, size_t errlen) {
  if (mkdir(dir, 0777) == 0)
    chmod(dir, 01777);
  else if (errno != EEXIST) {
    int e = errno;
    snprintf(err, errlen, "cannot make the port claim folder %s: %s", dir,
             strerror(e));
    return -e;
  }
  /* another user may have made it, or a link in its place: trust only a
   * real folder of ours, or root's with the sticky bit (like /tmp) */
  struct stat st;
  if (lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode) ||
      !(st.st_uid == geteuid() || (st.st_uid == 0 && (st.st_mode & S_ISVTX)))) {
    snprintf(err, errlen, "the port claim folder %s is not a folder of this "
             "user nor root's sticky one (set TSR_TEST_PORT_DIR to one)", dir);
    return -EPERM;
  }
  char path[4200];
  snprintf(path, sizeof path, "%s/.lock", dir);
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
  if (fd >= 0 && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))) {
    close(fd);
    fd = -1;
    errno = EPERM;
  }
  /* past the umask, so every user locks it; only on a file of ours */
  if (fd >= 0 && st.st_uid == geteuid()) fchmod(fd, 0666);
  if (fd < 0 || flock(fd, LOCK_EX) != 0) {
    int e = errno;
    snprintf(err, errlen, "cannot lock %s: %s", path, strerror(e));
    if (fd >= 0) close(fd);
    return -e;
  }
  return fd;
}

static unsigned tp_random(void) {
  unsigned r;
  if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r)
    r = (unsigned)getpid() * 2654435761u;
  return r;
}

int test_ports_claim(int n, int run, long owner, int *ports, char *err,
                     size_t errlen) {
  tp_range blk, eph;
  int rc = tp_block(&blk, err, errlen);
  if (rc) return rc;
  tp_ephemeral(&eph);
  if (n < 1 || n > blk.hi - blk.lo + 1) {
    snprintf(err, errlen, "%d ports asked for: expected 1 to %d (the block "
             "%d-%d)", n, blk.hi - blk.lo + 1, blk.lo, blk.hi);
    return -EINVAL;
  }
  unsigned long long start = tp_start_time(owner);
  if (owner <= 0 || !start) {
    snprintf(err, errlen, "the owner of the claims, PID %ld, is not running",
             owner);
    return -ESRCH;
  }
  /* the candidates: each port of the block outside the ephemeral range,
   * or with `run` each multiple of n whose n ports all are */
  int span = blk.hi - blk.lo + 1, count = 0;
  int *cand = malloc((size_t)span * sizeof *cand);
  if (!cand) return -ENOMEM;
  for (int p = blk.lo; p + (run ? n - 1 : 0) <= blk.hi; p++) {
    if (run && p % n) continue;
    int last = p + (run ? n - 1 : 0);
    if (last < eph.lo || p > eph.hi) cand[count++] = p;
  }
  const char *dir = tp_dir();
  int lock = tp_lock(dir, err, errlen);
  if (lock < 0) {
    free(cand);
    return lock;
  }
  int got = 0;
  unsigned first = count ? tp_random() % (unsigned)count : 0;
  for (int i = 0; i < count && got < n && rc >= 0; i++) {
    int p = cand[(first + (unsigned)i) % (unsigned)count];
    if (!run) {
      rc = tp_take(dir, p, owner, start);
      if (rc == 1) ports[got++] = p;
      continue;
    }
    for (int k = 0; k < n; k++) {
      rc = tp_take(dir, p + k, owner, start);
      if (rc != 1) break;
      ports[got++] = p + k;
    }
    if (got < n) {
      tp_drop(dir, ports, got);
      got = 0;
    }
  }
  if (rc < 0)
    snprintf(err, errlen, "cannot write a claim in %s: %s", dir,
             strerror(-rc));
  else if (got < n) {
    if (run)
      snprintf(err, errlen, "cannot claim %d consecutive ports in %d-%d "
               "outside the ephemeral range %d-%d: no such run free (claims "
               "in %s)", n, blk.lo, blk.hi, eph.lo, eph.hi, dir);
    else
      snprintf(err, errlen, "cannot claim %d port%s in %d-%d outside the "
               "ephemeral range %d-%d: only %d free (claims in %s)", n,
               n == 1 ? "" : "s", blk.lo, blk.hi, eph.lo, eph.hi, got, dir);
    rc = -EADDRINUSE;
  } else
    rc = 0;
  if (rc) tp_drop(dir, ports, got);
  close(lock); /* drops the lock */
  free(cand);
  return rc;
}

/* A claim file's port, or -1 for any other name in the folder. */
static int tp_port_of(const char *name) {
  char *end;
  long p = strtol(name, &end, 10);
  return *name && !*end && p > 0 && p < 65536 ? (int)p : -1;
}

int test_ports_release(long owner, const int *ports, int n, char *err,
                       size_t errlen) {
  const char *dir = tp_dir();
  struct stat st;
  if (stat(dir, &st) != 0) return 0; /* nothing was ever claimed */
  int lock = tp_lock(dir, err, errlen);
  if (lock < 0) return lock;
  int done = 0;
  unsigned long long start;
  if (n > 0) {
    for (int i = 0; i < n; i++)
      if (tp_read_claim(dir, ports[i], &start) == owner) {
        tp_drop(dir, &ports[i], 1);
        done++;
      }
  } else {
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
      int p = tp_port_of(e->d_name);
      if (p > 0 && tp_read_claim(dir, p, &start) == owner) {
        tp_drop(dir, &p, 1);
        done++;
      }
    }
    if (d) closedir(d);
  }
  close(lock);
  return done;
}

int test_port(void) {
  char err[512];
  int port;
  if (test_ports_claim(1, 0, (long)getpid(), &port, err, sizeof err)) {
    fprintf(stderr, "test_port: %s\n", err);
    abort();
  }
  return port;
}
