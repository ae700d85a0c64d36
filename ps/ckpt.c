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
#include <unistd.h>

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

/* What a shard's file is written through: one pass over the snapshot's
 * rows, block by block (each block copied out under the snapshot's lock),
 * each section's bytes staged and sent with pwrite at the section's own
 * offset, its CRC32C kept as it goes. The header comes last, at offset 0:
 * its data CRC is fixed-width, so its length is known before the data
 * goes out; the whole data's CRC and the file's are the sections' joined
 * (tsr_crc32c_combine). A snapshot thus costs one copy of each row on its
 * way to the disk, and no second pass for the CRC. */
#define CK_SEC_BUF (1u << 20)
#define CK_BLOCK_BYTES (256u << 10)
typedef struct {
  uint64_t off;   /* where the next staged bytes go */
  uint64_t len;   /* the section's length */
  uint32_t crc;   /* of its bytes so far */
  uint8_t *buf;
  size_t n;
} ck_sec;

static int ck_pwrite(int fd, const void *p, size_t n, uint64_t off) {
  const uint8_t *b = p;
  while (n) {
    ssize_t w = pwrite(fd, b, n, (off_t)off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return w < 0 ? -errno : TSR_EIO;
    b += w;
    n -= (size_t)w;
    off += (uint64_t)w;
  }
  return 0;
}

static int ck_sec_flush(int fd, ck_sec *c) {
  if (!c->n) return 0;
  c->crc = tsr_crc32c(c->crc, c->buf, c->n);
  int rc = ck_pwrite(fd, c->buf, c->n, c->off);
  c->off += c->n;
  c->n = 0;
  return rc;
}

static int ck_sec_put(int fd, ck_sec *c, const void *p, size_t n) {
  const uint8_t *b = p;
  while (n) {
    size_t k = CK_SEC_BUF - c->n < n ? CK_SEC_BUF - c->n : n;
    memcpy(c->buf + c->n, b, k);
    c->n += k;
    b += k;
    n -= k;
    int rc = c->n == CK_SEC_BUF ? ck_sec_flush(fd, c) : 0;
    if (rc) return rc;
  }
  return 0;
}

/* The header; data_crc32c fixed-width, so a second packing with the real
 * CRC has the first one's length. */
static void ck_header(msgpack_packer *pk, const ps_snap_info *in,
                      const ps_ckpt_ident *who, uint64_t nrows,
                      uint64_t data_bytes, uint32_t dcrc) {
  const ps_var_spec *sp = &in->spec;
  size_t W = (size_t)in->width;
  uint64_t sec_bytes = nrows * W * sizeof(float);
  int nsec = 1 + in->nslots + (in->sparse ? 1 : 0);
  msgpack_pack_map(pk, 22);
  pk_str(pk, "format"); pk_str(pk, "tessera-shard");
  pk_str(pk, "version"); msgpack_pack_int(pk, 2);
  pk_str(pk, "checkpoint_id"); pk_str(pk, who ? who->id : "");
  pk_str(pk, "checkpoint_step"); msgpack_pack_int64(pk, who ? who->step : 0);
  pk_str(pk, "name"); pk_str(pk, sp->var.name);
  pk_str(pk, "shape");
  msgpack_pack_array(pk, (size_t)sp->var.rank);
  for (int i = 0; i < sp->var.rank; i++)
    msgpack_pack_int64(pk, sp->var.shape[i]);
  pk_str(pk, "sparse");
  in->sparse ? msgpack_pack_true(pk) : msgpack_pack_false(pk);
  pk_str(pk, "bounded");
  sp->bounded ? msgpack_pack_true(pk) : msgpack_pack_false(pk);
  pk_str(pk, "shard"); msgpack_pack_int(pk, sp->shard.shard);
  pk_str(pk, "num_shards"); msgpack_pack_int(pk, sp->shard.num_shards);
  pk_str(pk, "row0"); msgpack_pack_int64(pk, sp->shard.row0);
  pk_str(pk, "rows"); msgpack_pack_int64(pk, sp->shard.rows);
  pk_str(pk, "width"); msgpack_pack_int64(pk, in->width);
  pk_str(pk, "optimizer"); pk_str(pk, tsr_optim_name(sp->optim.kind));
  pk_str(pk, "slots");
  msgpack_pack_array(pk, (size_t)in->nslots);
  for (int k = 0; k < in->nslots; k++)
    pk_str(pk, kern_optim_slot_name(&sp->optim, k));
  pk_str(pk, "step"); msgpack_pack_int64(pk, in->step);
  pk_str(pk, "var_version"); msgpack_pack_uint64(pk, in->version);
  pk_str(pk, "n_rows"); msgpack_pack_uint64(pk, nrows);
  pk_str(pk, "data_bytes"); msgpack_pack_uint64(pk, data_bytes);
  pk_str(pk, "data_crc32c"); msgpack_pack_fix_uint32(pk, dcrc);
  pk_str(pk, "sections");
  msgpack_pack_array(pk, (size_t)nsec);
  uint64_t off = 0;
  int64_t rows_dim = (int64_t)nrows;
  if (in->sparse) {
    pk_section(pk, "ids", "<i8", rows_dim, -1, off, nrows * 8);
    off += nrows * 8;
  }
  pk_section(pk, "value", "<f4", rows_dim, (int64_t)W, off, sec_bytes);
  off += sec_bytes;
  for (int k = 0; k < in->nslots; k++) {
    char nm[64];
    snprintf(nm, sizeof nm, "slot/%s", kern_optim_slot_name(&sp->optim, k));
    pk_section(pk, nm, "<f4", rows_dim, (int64_t)W, off, sec_bytes);
    off += sec_bytes;
  }
  pk_str(pk, "written_by"); pk_str(pk, "tessera-ps");
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

int ps__ckpt_save_snap(ps_snap *v, const char *dir, const ps_ckpt_ident *who,
                       bool verify, ps_ckpt_file *out, char *err,
                       size_t errlen) {
  const ps_snap_info *in = ps__snap_info(v);
  char fname[3 * TSR_VAR_NAME_MAX + 64], path[TSR_PATH_MAX];
  int rc = ps__ckpt_file_name(&in->spec, fname, sizeof fname);
  if (rc)
    return tsr_errf(err, errlen, rc, "%s: name too long", in->spec.var.name);
  if (snprintf(path, sizeof path, "%s/%s", dir, fname) >= (int)sizeof path)
    return tsr_errf(err, errlen, TSR_ERANGE, "%s/%s: path too long", dir,
                    fname);
  size_t W = (size_t)in->width, S = W * (size_t)(1 + in->nslots);
  uint64_t nrows = in->n_rows;
  uint64_t sec_bytes = nrows * W * sizeof(float);
  uint64_t ids_bytes = in->sparse ? nrows * 8 : 0;
  uint64_t data_bytes = sec_bytes * (uint64_t)(1 + in->nslots) + ids_bytes;

  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  ck_header(&pk, in, who, nrows, data_bytes, 0);
  size_t hlen = sb.size;
  uint64_t base = 16 + (uint64_t)hlen;

  int nsec = 1 + in->nslots + 1; /* [ids], value, slots */
  ck_sec sec[KERN_OPTIM_MAX_SLOTS + 2];
  memset(sec, 0, sizeof sec);
  size_t B = CK_BLOCK_BYTES / (S * sizeof(float));
  if (B < 1) B = 1;
  float *recs = malloc(B * S * sizeof(float));
  int64_t *ids = malloc(B * sizeof(int64_t));
  bool bufs = recs && ids;
  for (int k = 0; k < nsec && bufs; k++)
    bufs = (sec[k].buf = malloc(CK_SEC_BUF)) != NULL;
  tsr_atomic_file af;
  bool opened = false;
  if (!bufs) {
    rc = tsr_errf(err, errlen, TSR_ENOMEM, "%s: out of memory for the write "
                  "buffers", path);
    goto out;
  }
  sec[0].off = base;
  sec[0].len = ids_bytes;
  for (int k = 1; k < nsec; k++) {
    sec[k].off = base + ids_bytes + (uint64_t)(k - 1) * sec_bytes;
    sec[k].len = sec_bytes;
  }
  if ((rc = tsr_atomic_open(&af, path, err, errlen))) goto out;
  opened = true;
  int fd = fileno(af.f);
  for (uint64_t r = 0; r < nrows && !rc; r += B) {
    size_t n = nrows - r < B ? (size_t)(nrows - r) : B;
    if ((rc = ps__snap_read(v, (size_t)r, n, recs, in->sparse ? ids : NULL,
                            err, errlen)))
      break;
    if (in->sparse) rc = ck_sec_put(fd, &sec[0], ids, n * sizeof(int64_t));
    for (size_t i = 0; i < n && !rc; i++)
      for (int k = 1; k < nsec && !rc; k++)
        rc = ck_sec_put(fd, &sec[k], recs + i * S + (size_t)(k - 1) * W,
                        W * sizeof(float));
    if (rc)
      tsr_errf(err, errlen, rc, "%s: write failed: %s", af.tmp,
               tsr_strerror(rc));
  }
  for (int k = 0; k < nsec && !rc; k++)
    if ((rc = ck_sec_flush(fd, &sec[k])))
      tsr_errf(err, errlen, rc, "%s: write failed: %s", af.tmp,
               tsr_strerror(rc));
  if (rc) goto out;
  uint32_t dcrc = sec[0].crc;
  for (int k = 1; k < nsec; k++)
    dcrc = tsr_crc32c_combine(dcrc, sec[k].crc, sec[k].len);
  msgpack_sbuffer_clear(&sb);
  ck_header(&pk, in, who, nrows, data_bytes, dcrc);
  if (sb.size != hlen) { /* cannot happen: every varying field is fixed */
    rc = tsr_errf(err, errlen, TSR_EINVAL, "%s: header length changed", path);
    goto out;
  }
  uint8_t head[16];
  uint32_t hl = (uint32_t)hlen, hcrc = tsr_crc32c(0, sb.data, sb.size);
  memcpy(head, PS__MAGIC, 8);
  memcpy(head + 8, &hl, 4);
  uint32_t fcrc = tsr_crc32c(0, head, 12);
  fcrc = tsr_crc32c(fcrc, sb.data, sb.size);
  fcrc = tsr_crc32c(fcrc, &hcrc, 4);
  fcrc = tsr_crc32c_combine(fcrc, dcrc, data_bytes);
  if ((rc = ck_pwrite(fd, head, 12, 0)) ||
      (rc = ck_pwrite(fd, sb.data, sb.size, 12)) ||
      (rc = ck_pwrite(fd, &hcrc, 4, 12 + hlen))) {
    tsr_errf(err, errlen, rc, "%s: write failed: %s", af.tmp,
             tsr_strerror(rc));
    goto out;
  }
  opened = false;
  /* flush (nothing is staged in the stream), fsync, rename over the
   * file, fsync the folder */
  if ((rc = tsr_atomic_commit(&af, err, errlen))) goto out;
  uint64_t bytes = base + data_bytes;
  if (verify && (rc = ck_verify(path, bytes, fcrc, err, errlen))) goto out;
  if (out) {
    snprintf(out->name, sizeof out->name, "%s", fname);
    out->bytes = bytes;
    out->crc32c = fcrc;
  }
out:
  if (opened) tsr_atomic_abort(&af);
  msgpack_sbuffer_destroy(&sb);
  for (int k = 0; k < nsec; k++) free(sec[k].buf);
  free(recs);
  free(ids);
  return rc;
}

int ps__ckpt_save_shard(const ps_shard *s, const char *dir,
                        const ps_ckpt_ident *who, bool verify,
                        ps_ckpt_file *out, char *err, size_t errlen) {
  ps_mem m;
  memset(&m, 0, sizeof m);
  ps_snap *v;
  int rc = ps__snap_take(s, &m, &v, err, errlen);
  if (rc) return rc;
  rc = ps__ckpt_save_snap(v, dir, who, verify, out, err, errlen);
  ps__snap_free(v);
  return rc;
}
