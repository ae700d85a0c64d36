/* Shard checkpoint files: writing them (ckpt_load.c reads them back).
 *
 * One file per saved shard part, named <var>.part-<k>-of-<n>.tshard (the
 * variable name with every byte outside [A-Za-z0-9._-] written as %XX):
 *
 *   offset 0    8 bytes  magic "TSRSHARD"
 *   offset 8    u32 LE   H, the header length
 *   offset 12   H bytes  header: a msgpack map (below)
 *   offset 12+H u32 LE   CRC32C of the header bytes
 *   offset 16+H          data: the sections back to back, little-endian
 *
 * Header keys: format "tessera-shard", version 2, checkpoint_id and
 * checkpoint_step (which checkpoint the file belongs to: a file copied in
 * from another one is refused on restore), name, shape (full variable),
 * sparse, bounded, shard, num_shards, row0, rows (the part's place in the
 * saved layout), width, optimizer (Keras name), slots (slot names in
 * order), step (applies, as Adam's t), var_version, n_rows (rows stored),
 * data_bytes, data_crc32c (CRC32C of all data bytes), sections: a list of
 * {name, dtype ("<f4" or "<i8", numpy's spelling), shape, offset (from the
 * data start), nbytes}. Dense parts hold "value" [rows, ...] and one
 * "slot/<name>" each; sparse parts hold "ids" [n_rows] then "value" and
 * the slots as [n_rows, width]. From Python:
 *   b = open(f, 'rb').read(); H = struct.unpack('<I', b[8:12])[0]
 *   h = msgpack.unpackb(b[12:12+H]); base = 16 + H
 *   for s in h['sections']: np.frombuffer(b, s['dtype'], offset=base +
 *       s['offset'], count=s['nbytes'] // np.dtype(s['dtype']).itemsize)
 *
 * Save writes <file>.tmp.<pid>, fsyncs it, renames it over <file> and
 * fsyncs the folder (tsr_atomic_open / tsr_atomic_commit, common/fs.h); it reports the file's size and the CRC32C of all its bytes
 * (for the chief's manifest) and, asked to verify (a checkpoint folder the
 * chief cannot see), reads the file back and checks both.
 * Failure modes: a name too long, a write, fsync or rename that fails, a
 * file that reads back different: each names the file.
 */
#include "ps/ps_int.h"
#include "common/crc32c.h"
#include "common/err.h"
#include "common/fs.h"

#include <errno.h>
#include <inttypes.h>
#include <msgpack.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PS__MAGIC "TSRSHARD"

void ps__ckpt_enc_name(const char *name, char *out, size_t len) {
  size_t o = 0;
  for (const unsigned char *p = (const unsigned char *)name; *p && o + 4 < len;
       p++) {
    if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
        (*p >= '0' && *p <= '9') || *p == '.' || *p == '_' || *p == '-')
      out[o++] = (char)*p;
    else
      o += (size_t)snprintf(out + o, len - o, "%%%02X", *p);
  }
  out[o] = 0;
}

int ps__ckpt_file_name(const ps_var_spec *s, char *buf, size_t len) {
  char enc[3 * TSR_VAR_NAME_MAX + 1];
  ps__ckpt_enc_name(s->var.name, enc, sizeof enc);
  int n = snprintf(buf, len, "%s.part-%d-of-%d.tshard", enc, s->shard.shard,
                   s->shard.num_shards);
  return n < 0 || (size_t)n >= len ? TSR_ERANGE : 0;
}

/* ---- save ------------------------------------------------------------------*/

static void pk_str(msgpack_packer *pk, const char *s) {
  size_t n = strlen(s);
  msgpack_pack_str(pk, n);
  msgpack_pack_str_body(pk, s, n);
}

static void pk_section(msgpack_packer *pk, const char *name, const char *dt,
                       int64_t d0, int64_t d1, uint64_t off, uint64_t nbytes) {
  msgpack_pack_map(pk, 5);
  pk_str(pk, "name");
  pk_str(pk, name);
  pk_str(pk, "dtype");
  pk_str(pk, dt);
  pk_str(pk, "shape");
  msgpack_pack_array(pk, d1 >= 0 ? 2 : 1);
  msgpack_pack_int64(pk, d0);
  if (d1 >= 0) msgpack_pack_int64(pk, d1);
  pk_str(pk, "offset");
  msgpack_pack_uint64(pk, off);
  pk_str(pk, "nbytes");
  msgpack_pack_uint64(pk, nbytes);
}

/* What a shard's file is written through: rows arrive one by one (8 bytes
 * of id, or a row of W floats), so they are gathered into a buffer and
 * each full buffer goes to the CRCs and to the file at once; per row, a
 * CRC call and an fwrite (which locks the stream) cost more than the
 * disk. Without a file (the CRC-only pass) only `crc` is kept. */
#define CK_BUF (1u << 20)
typedef struct {
  FILE *f;
  uint32_t crc;      /* of what this writer passed on (a section's data) */
  uint32_t file_crc; /* of every byte written to f */
  uint64_t bytes;
  int section; /* -1 ids, 0 value, k slot k */
  size_t W;
  int err;
  uint8_t *buf; /* CK_BUF bytes */
  size_t n;     /* of them held */
} ck_writer;

static void ck_out(ck_writer *w, const void *p, size_t n) {
  w->crc = tsr_crc32c(w->crc, p, n);
  if (!w->f) return;
  w->file_crc = tsr_crc32c(w->file_crc, p, n);
  w->bytes += n;
  if (fwrite(p, 1, n, w->f) != n) w->err = errno ? -errno : TSR_EIO;
}

static void ck_flush(ck_writer *w) {
  if (w->n) ck_out(w, w->buf, w->n);
  w->n = 0;
}

static void ck_put(ck_writer *w, const void *p, size_t n) {
  if (!w->buf || n > CK_BUF / 2) { /* no buffer (dense), or large */
    ck_flush(w);
    ck_out(w, p, n);
    return;
  }
  if (w->n + n > CK_BUF) ck_flush(w);
  memcpy(w->buf + w->n, p, n);
  w->n += n;
}

static void ck_put_row(void *ctx, int64_t id, const float *rec) {
  ck_writer *w = ctx;
  if (w->section < 0)
    ck_put(w, &id, sizeof id);
  else
    ck_put(w, rec + (size_t)w->section * w->W, w->W * sizeof(float));
}

/* Reads a written file back: its size and the CRC32C of every byte. */
static int ck_verify(const char *path, uint64_t bytes, uint32_t crc,
                     char *err, size_t errlen) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return tsr_errf(err, errlen, -errno, "%s: cannot read it back: %s", path,
                    strerror(errno));
  uint8_t buf[1 << 16];
  uint64_t n = 0;
  uint32_t c = 0;
  size_t r;
  while ((r = fread(buf, 1, sizeof buf, f)) > 0) {
    c = tsr_crc32c(c, buf, r);
    n += r;
  }
  int bad = ferror(f);
  fclose(f);
  if (bad)
    return tsr_errf(err, errlen, TSR_EIO, "%s: read error reading it back",
                    path);
  if (n != bytes || c != crc)
    return tsr_errf(err, errlen, TSR_ECORRUPT, "%s: reads back as %" PRIu64
                    " bytes with CRC32C %08x, written %" PRIu64 " bytes with "
                    "%08x", path, n, c, bytes, crc);
  return 0;
}

int ps__ckpt_save_shard(const ps_shard *s, const char *dir,
                        const ps_ckpt_ident *who, bool verify,
                        ps_ckpt_file *out, char *err, size_t errlen) {
  char fname[3 * TSR_VAR_NAME_MAX + 64], path[TSR_PATH_MAX];
  int rc = ps__ckpt_file_name(&s->spec, fname, sizeof fname);
  if (rc)
    return tsr_errf(err, errlen, rc, "%s: name too long", s->spec.var.name);
  if (snprintf(path, sizeof path, "%s/%s", dir, fname) >= (int)sizeof path)
    return tsr_errf(err, errlen, TSR_ERANGE, "%s/%s: path too long", dir,
                    fname);
  size_t W = (size_t)s->width;
  uint64_t nrows = ps_var_spec_sparse(&s->spec) ? s->rows.count
                                                : (uint64_t)s->spec.shard.rows;
  uint64_t sec_bytes = nrows * W * sizeof(float);
  int nsec = 1 + s->nslots + (ps_var_spec_sparse(&s->spec) ? 1 : 0);
  uint64_t data_bytes = sec_bytes * (uint64_t)(1 + s->nslots) +
                        (ps_var_spec_sparse(&s->spec) ? nrows * 8 : 0);

  /* the data CRC goes in the header, so compute it first */
  uint32_t dcrc = 0;
  uint8_t *buf = NULL;
  if (ps_var_spec_sparse(&s->spec) && !(buf = malloc(CK_BUF)))
    return tsr_errf(err, errlen, TSR_ENOMEM, "%s: out of memory for the "
                    "write buffer", path);
  ck_writer w = {.W = W, .buf = buf};
  if (ps_var_spec_sparse(&s->spec)) {
    /* a CRC-only pass: with no file nothing is written */
    for (w.section = -1; w.section <= s->nslots; w.section++)
      ps__rows_each(&s->rows, ck_put_row, &w);
    ck_flush(&w);
    dcrc = w.crc;
  } else {
    dcrc = tsr_crc32c(dcrc, s->w, sec_bytes);
    for (int k = 0; k < s->nslots; k++)
      dcrc = tsr_crc32c(dcrc, s->slots[k], sec_bytes);
  }

  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 22);
  pk_str(&pk, "format"); pk_str(&pk, "tessera-shard");
  pk_str(&pk, "version"); msgpack_pack_int(&pk, 2);
  pk_str(&pk, "checkpoint_id"); pk_str(&pk, who ? who->id : "");
  pk_str(&pk, "checkpoint_step"); msgpack_pack_int64(&pk, who ? who->step : 0);
  pk_str(&pk, "name"); pk_str(&pk, s->spec.var.name);
  pk_str(&pk, "shape");
  msgpack_pack_array(&pk, (size_t)s->spec.var.rank);
  for (int i = 0; i < s->spec.var.rank; i++)
    msgpack_pack_int64(&pk, s->spec.var.shape[i]);
  pk_str(&pk, "sparse");
  ps_var_spec_sparse(&s->spec) ? msgpack_pack_true(&pk)
                               : msgpack_pack_false(&pk);
  pk_str(&pk, "bounded");
  s->spec.bounded ? msgpack_pack_true(&pk) : msgpack_pack_false(&pk);
  pk_str(&pk, "shard"); msgpack_pack_int(&pk, s->spec.shard.shard);
  pk_str(&pk, "num_shards"); msgpack_pack_int(&pk, s->spec.shard.num_shards);
  pk_str(&pk, "row0"); msgpack_pack_int64(&pk, s->spec.shard.row0);
  pk_str(&pk, "rows"); msgpack_pack_int64(&pk, s->spec.shard.rows);
  pk_str(&pk, "width"); msgpack_pack_int64(&pk, s->width);
  pk_str(&pk, "optimizer"); pk_str(&pk, tsr_optim_name(s->spec.optim.kind));
  pk_str(&pk, "slots");
  msgpack_pack_array(&pk, (size_t)s->nslots);
  for (int k = 0; k < s->nslots; k++)
    pk_str(&pk, kern_optim_slot_name(&s->spec.optim, k));
  pk_str(&pk, "step"); msgpack_pack_int64(&pk, s->step);
  pk_str(&pk, "var_version"); msgpack_pack_uint64(&pk, s->version);
  pk_str(&pk, "n_rows"); msgpack_pack_uint64(&pk, nrows);
  pk_str(&pk, "data_bytes"); msgpack_pack_uint64(&pk, data_bytes);
  pk_str(&pk, "data_crc32c"); msgpack_pack_uint32(&pk, dcrc);
  pk_str(&pk, "sections");
  msgpack_pack_array(&pk, (size_t)nsec);
  uint64_t off = 0;
  int64_t rows_dim = (int64_t)nrows;
  if (ps_var_spec_sparse(&s->spec)) {
    pk_section(&pk, "ids", "<i8", rows_dim, -1, off, nrows * 8);
    off += nrows * 8;
  }
  pk_section(&pk, "value", "<f4", rows_dim, (int64_t)W, off, sec_bytes);
  off += sec_bytes;
  for (int k = 0; k < s->nslots; k++) {
    char nm[64];
    snprintf(nm, sizeof nm, "slot/%s", kern_optim_slot_name(&s->spec.optim, k));
    pk_section(&pk, nm, "<f4", rows_dim, (int64_t)W, off, sec_bytes);
    off += sec_bytes;
  }
  pk_str(&pk, "written_by"); pk_str(&pk, "tessera-ps");

  tsr_atomic_file af;
  if ((rc = tsr_atomic_open(&af, path, err, errlen))) {
    msgpack_sbuffer_destroy(&sb);
    free(buf);
    return rc;
  }
  setvbuf(af.f, NULL, _IOFBF, 1 << 20);
  uint32_t hlen = (uint32_t)sb.size, hcrc = tsr_crc32c(0, sb.data, sb.size);
  w = (ck_writer){.f = af.f, .W = W, .buf = buf};
  ck_put(&w, PS__MAGIC, 8);
  ck_put(&w, &hlen, 4);
  ck_put(&w, sb.data, sb.size);
  ck_put(&w, &hcrc, 4);
  msgpack_sbuffer_destroy(&sb);
  if (ps_var_spec_sparse(&s->spec)) {
    for (w.section = -1; w.section <= s->nslots; w.section++)
      ps__rows_each(&s->rows, ck_put_row, &w);
  } else {
    ck_put(&w, s->w, sec_bytes);
    for (int k = 0; k < s->nslots; k++) ck_put(&w, s->slots[k], sec_bytes);
  }
  ck_flush(&w);
  free(buf);
  if (w.err) {
    tsr_atomic_abort(&af);
    return tsr_errf(err, errlen, w.err, "%s: write failed: %s", af.tmp,
                    tsr_strerror(w.err));
  }
  /* flush, fsync, rename over the file, fsync the folder */
  if ((rc = tsr_atomic_commit(&af, err, errlen))) return rc;
  if (verify && (rc = ck_verify(path, w.bytes, w.file_crc, err, errlen)))
    return rc;
  if (out) {
    snprintf(out->name, sizeof out->name, "%s", fname);
    out->bytes = w.bytes;
    out->crc32c = w.file_crc;
  }
  return 0;
}

