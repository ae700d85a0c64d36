/* What `tessera local` prepares before starting anything: free ports, the
 * cluster token, each task's TF_CONFIG, and where the binaries are.
 * Failures name what was tried (the host that would not bind, every folder
 * searched for a binary). */
#include "chief/cli/local.h"
#include "common/err.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <netinet/in.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static const char *const role_names[CHIEF_LOCAL__ROLES] = {
    "chief", "ps", "worker", "evaluator"};
static const char *const role_bins[CHIEF_LOCAL__ROLES] = {
    "tessera-chief", "tessera-ps", "tessera-worker", "tessera-chief"};
/* Build tree: each binary in its module's folder. */
static const char *const role_dirs[CHIEF_LOCAL__ROLES] = {"chief", "ps",
                                                          "worker", "chief"};

const char *chief_local_role_name(chief_local_role role) {
  return role >= 0 && role < CHIEF_LOCAL__ROLES ? role_names[role] : "?";
}

int chief_local_free_ports(const char *host, int n, int *ports, char *err,
                           size_t errlen) {
  struct sockaddr_in sa = {.sin_family = AF_INET};
  if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
    snprintf(err, errlen, "host \"%s\" is not an IPv4 address", host);
    return TSR_EINVAL;
  }
  int *fds = calloc((size_t)n, sizeof *fds);
  if (!fds) return TSR_ENOMEM;
  int rc = 0, opened = 0;
  for (; opened < n; opened++) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      rc = -errno;
      snprintf(err, errlen, "socket: %s", strerror(errno));
      break;
    }
    fds[opened] = fd;
    struct sockaddr_in got;
    socklen_t gl = sizeof got;
    sa.sin_port = 0;
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        getsockname(fd, (struct sockaddr *)&got, &gl) != 0) {
      rc = -errno;
      snprintf(err, errlen, "cannot bind a port on %s: %s", host,
               strerror(errno));
      close(fd);
      break;
    }
    ports[opened] = ntohs(got.sin_port);
  }
  for (int i = 0; i < opened; i++) close(fds[i]);
  free(fds);
  return rc;
}

int chief_local_token(char *hex, size_t len) {
  unsigned char raw[32];
  if (len < 2 * sizeof raw + 1) return TSR_EINVAL;
  if (sodium_init() < 0) return TSR_EIO;
  randombytes_buf(raw, sizeof raw);
  sodium_bin2hex(hex, len, raw, sizeof raw);
  sodium_memzero(raw, sizeof raw);
  return 0;
}

static json_t *addr_list(const char *host, const int *ports, int n) {
  json_t *a = json_array();
  for (int i = 0; a && i < n; i++) {
    char s[300];
    snprintf(s, sizeof s, "%s:%d", host, ports[i]);
    json_array_append_new(a, json_string(s));
  }
  return a;
}

static json_t *cluster_map(const char *host, int chief_port,
                           const int *ps_ports, int n_ps,
                           const int *worker_ports, int n_workers) {
  json_t *cluster = json_object();
  if (!cluster) return NULL;
  json_object_set_new(cluster, "chief", addr_list(host, &chief_port, 1));
  json_object_set_new(cluster, "ps", addr_list(host, ps_ports, n_ps));
  json_object_set_new(cluster, "worker",
                      addr_list(host, worker_ports, n_workers));
  return cluster;
}

char *chief_local_cluster_json(const char *host, int chief_port,
                               const int *ps_ports, int n_ps,
                               const int *worker_ports, int n_workers) {
  json_t *cluster =
      cluster_map(host, chief_port, ps_ports, n_ps, worker_ports, n_workers);
  char *out =
      cluster ? json_dumps(cluster, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
  json_decref(cluster);
  return out;
}

char *chief_local_tf_config(const char *host, int chief_port,
                            const int *ps_ports, int n_ps,
                            const int *worker_ports, int n_workers,
                            chief_local_role role, int index) {
  json_t *cluster =
      cluster_map(host, chief_port, ps_ports, n_ps, worker_ports, n_workers);
  json_t *task = json_object();
  json_t *root = json_object();
  char *out = NULL;
  if (!cluster || !task || !root) goto done;
  json_object_set_new(task, "type", json_string(chief_local_role_name(role)));
  json_object_set_new(task, "index", json_integer(index));
  json_object_set(root, "cluster", cluster);
  json_object_set(root, "task", task);
  out = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
done:
  json_decref(cluster);
  json_decref(task);
  json_decref(root);
  return out;
}

static int try_exe(const char *dir, const char *sub, const char *name,
                   char *out, size_t len) {
  if (snprintf(out, len, "%s%s/%s", dir, sub, name) >= (int)len) return 0;
  return access(out, X_OK) == 0;
}

int chief_local_find_binary(const char *bin_dir, chief_local_role role,
                            char *out, size_t len, char *err, size_t errlen) {
  const char *name = role_bins[role];
  if (!bin_dir || !*bin_dir) bin_dir = getenv("TESSERA_BIN_DIR");
  if (bin_dir && *bin_dir) {
    if (try_exe(bin_dir, "", name, out, len)) return 0;
    snprintf(err, errlen, "%s/%s is missing or not executable", bin_dir,
             name);
    return TSR_ENOTFOUND;
  }
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  char dir[PATH_MAX] = "";
  if (n > 0) {
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (slash) {
      *slash = '\0';
      snprintf(dir, sizeof dir, "%s", self);
    }
  }
  if (*dir) {
    /* Installed: side by side. Build tree: chief/tessera beside ps/ and
     * worker/. */
    if (try_exe(dir, "", name, out, len)) return 0;
    char sub[32];
    snprintf(sub, sizeof sub, "/../%s", role_dirs[role]);
    if (try_exe(dir, sub, name, out, len)) return 0;
  }
  const char *path = getenv("PATH");
  if (path) {
    const char *p = path;
    while (*p) {
      const char *e = strchr(p, ':');
      size_t l = e ? (size_t)(e - p) : strlen(p);
      if (l > 0 && l < PATH_MAX) {
        char d[PATH_MAX];
        memcpy(d, p, l);
        d[l] = '\0';
        if (try_exe(d, "", name, out, len)) return 0;
      }
      p += l;
      if (*p == ':') p++;
    }
  }
  snprintf(err, errlen,
           "cannot find %s: looked in %s, %s/../%s and $PATH; pass --bin-dir "
           "DIR or set TESSERA_BIN_DIR",
           name, *dir ? dir : "(unknown executable folder)",
           *dir ? dir : "(unknown)", role_dirs[role]);
  return TSR_ENOTFOUND;
}
