/* Files that survive a crash: folders made with their parents, files
 * replaced whole.
 *
 * Happy path: tsr_mkdir_p() makes a folder and any missing parents;
 * tsr_write_atomic() writes `path`.tmp.<pid> beside the target, fsyncs it,
 * renames it over the target and fsyncs the folder, so a reader, or a
 * restart after a power cut, finds the old file or the new one and never
 * half of one. tsr_atomic_open() / tsr_atomic_commit() do the same for a
 * file written as a stream.
 * Failure modes: every function returns 0 or a negative code (-errno, or
 * TSR_EINVAL for a path over TSR_PATH_MAX, TSR_EEXISTS for a file where a
 * folder should be) with a message naming the path in `err` (which may be
 * NULL). A failed write removes its temp file and leaves the target as it
 * was.
 *
 * Threads: any; two writers of the same path in one process at once are
 * not supported (they share the temp name).
 */
#ifndef TSR_FS_H
#define TSR_FS_H

#include <stddef.h>
#include <stdio.h>

#define TSR_PATH_MAX 4096

/* mkdir -p: `mode` for the folders it makes (umask applies); an existing
 * folder is fine. */
int tsr_mkdir_p(const char *path, int mode, char *err, size_t errlen);

/* fsync of a folder, so the renames and creations in it are on disk. */
int tsr_fsync_dir(const char *dir, char *err, size_t errlen);

/* Replaces `path` with `len` bytes (mode 0666, umask applies). */
int tsr_write_atomic(const char *path, const void *data, size_t len,
                     char *err, size_t errlen);

/* A file being written to its temp name; `f` is where the bytes go. */
typedef struct {
  FILE *f;
  char path[TSR_PATH_MAX];
  char tmp[TSR_PATH_MAX + 32];
} tsr_atomic_file;

/* Creates the temp file. On failure nothing is left to abort. */
int tsr_atomic_open(tsr_atomic_file *a, const char *path, char *err,
                    size_t errlen);
/* Flushes, fsyncs and closes the temp file, renames it over the target and
 * fsyncs the folder; a write error seen on the stream fails it. The file is
 * closed whatever happens (and the temp file removed on failure). */
int tsr_atomic_commit(tsr_atomic_file *a, char *err, size_t errlen);
/* Closes and removes the temp file; the target stays as it was. */
void tsr_atomic_abort(tsr_atomic_file *a);

/* For a file another library wrote by name (libhdf5): fsyncs `tmp`,
 * renames it over `path` and fsyncs the folder; `tmp` is removed on
 * failure. */
int tsr_commit_written(const char *tmp, const char *path, char *err,
                       size_t errlen);

#endif /* TSR_FS_H */
