/* A minimal .npz writer: a ZIP archive (stored, no compression) of .npy
 * files, as numpy.savez writes it, so `numpy.load(path)` returns the
 * arrays by name, in the order they were added (NpzFile.files keeps the
 * archive order, which Keras `model.set_weights` needs).
 *
 * Limits: each array and the archive below 4 GiB (no ZIP64), at most
 * 65535 arrays. Written to a temp file beside PATH, fsynced, renamed over
 * PATH, then the folder fsynced (common/fs.h).
 */
#ifndef TSR_CHIEF_NPZ_H
#define TSR_CHIEF_NPZ_H

#include <stddef.h>
#include <stdint.h>

typedef struct chief_npz chief_npz;

int chief_npz_open(chief_npz **out, const char *path, char *err,
                   size_t errlen);
/* Adds `name`.npy: a little-endian float32 array of the given shape. */
int chief_npz_add_f32(chief_npz *z, const char *name, const int64_t *shape,
                      int rank, const float *data, char *err, size_t errlen);
/* Adds a member of any content under its own name (a .keras archive's
 * config.json, model.weights.h5). */
int chief_npz_add_file(chief_npz *z, const char *member, const void *data,
                       size_t len, char *err, size_t errlen);
/* Writes the central directory and renames the file into place; frees z.
 * On error the temp file is removed. */
int chief_npz_close(chief_npz *z, char *err, size_t errlen);
/* Frees without writing (removes the temp file). */
void chief_npz_abort(chief_npz *z);

/* The .npy header for a float32 array (padded so the data starts at a
 * multiple of 64 bytes); returns its length, or 0 if it does not fit. */
size_t chief_npy_header(char *buf, size_t cap, const int64_t *shape,
                        int rank);

/* A float32 .npy file written as its rows come (npy.c), for outputs whose
 * count is known only at the end (`tessera predict`): each row has the
 * shape `row` (rank < 8), the file the shape [rows, row...]. The header
 * is written last, into room kept for any row count; the file goes to a
 * temp name beside PATH and is renamed over it by chief_npy_close, so a
 * failed run leaves PATH as it was. */
typedef struct chief_npy chief_npy;

int chief_npy_open(chief_npy **out, const char *path, const int64_t *row,
                   int rank, char *err, size_t errlen);
/* Appends n rows (n * the row's elements floats). */
int chief_npy_append(chief_npy *w, const float *rows, int64_t n, char *err,
                     size_t errlen);
/* Writes the header and commits the file; frees w. */
int chief_npy_close(chief_npy *w, char *err, size_t errlen);
/* Frees without writing (removes the temp file). */
void chief_npy_abort(chief_npy *w);

#endif
