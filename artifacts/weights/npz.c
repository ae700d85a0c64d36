/* .npz writer; see npz.h. ZIP records are written little-endian field by
 * field; CRC-32 (the ZIP one, not CRC32C) comes from zlib. The archive is
 * streamed to a temp file (common/fs.h): close fsyncs it, renames it over
 * the target and fsyncs the folder; any failure removes the temp file. */
#include "artifacts/weights/npz.h"
#include "common/err.h"
#include "common/fs.h"
#include "common/grow.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

typedef struct {
  char *name;
  uint32_t crc, size, offset;
} npz_entry;

struct chief_npz {
  tsr_atomic_file af; /* af.f: where the bytes go */
  npz_entry *e;
  size_t n, cap;
  uint64_t off;
};

static void put16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}
static void put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

size_t chief_npy_header(char *buf, size_t cap, const int64_t *shape,
                        int rank) {
  char dict[512];
  int n = snprintf(dict, sizeof dict,
                   "{'descr': '<f4', 'fortran_order': False, 'shape': (");
  for (int i = 0; i < rank && n > 0 && (size_t)n < sizeof dict; i++)
    n += snprintf(dict + n, sizeof dict - (size_t)n, "%lld,%s",
                  (long long)shape[i], i + 1 < rank ? " " : "");
  if (n <= 0 || (size_t)n >= sizeof dict - 8) return 0;
  n += snprintf(dict + n, sizeof dict - (size_t)n, "), }");
  size_t total = 10 + (size_t)n + 1; /* magic+ver+len, dict, '\n' */
  size_t padded = (total + 63) / 64 * 64;
  if (padded > cap) return 0;
  memcpy(buf, "\x93NUMPY\x01\x00", 8);
  put16((uint8_t *)buf + 8, (uint16_t)(padded - 10));
  memcpy(buf + 10, dict, (size_t)n);
  memset(buf + 10 + n, ' ', padded - total);
  buf[padded - 1] = '\n';
  return padded;
}

int chief_npz_open(chief_npz **out, const char *path, char *err,
                   size_t errlen) {
  chief_npz *z = calloc(1, sizeof *z);
  if (!z) return TSR_ENOMEM;
  int rc = tsr_atomic_open(&z->af, path, err, errlen);
  if (rc) {
    free(z);
    return rc;
  }
  *out = z;
  return 0;
}

/* One stored member: a header part `hdr` (may be empty) then `data`. */
static int add_member(chief_npz *z, const char *member_in, const void *hdr,
                      size_t hl, const void *data, uint64_t dlen, char *err,
                      size_t errlen) {
  uint64_t size = hl + dlen;
  if (size >= 0xffffffffull || z->off + size >= 0xffffffffull ||
      z->n >= 65535) {
    snprintf(err, errlen, "%s: archive over 4 GiB or 65535 members (no "
             "ZIP64)", member_in);
    return TSR_ETOOBIG;
  }
  if (tsr_grow(&z->e, &z->cap, z->n, sizeof *z->e, 16)) return TSR_ENOMEM;
  char *member = strdup(member_in);
  if (!member) return TSR_ENOMEM;
  uLong crc = crc32(0L, Z_NULL, 0);
  if (hl) crc = crc32(crc, (const Bytef *)hdr, (uInt)hl);
  const uint8_t *p = (const uint8_t *)data;
  for (uint64_t left = dlen; left > 0;) {
    uInt chunk = left > (1u << 30) ? (1u << 30) : (uInt)left;
    crc = crc32(crc, p, chunk);
    p += chunk;
    left -= chunk;
  }
  uint8_t lh[30];
  memset(lh, 0, sizeof lh);
  put32(lh, 0x04034b50);
  put16(lh + 4, 20);              /* version needed */
  put16(lh + 10, 0);              /* mod time */
  put16(lh + 12, (1 << 5) | 1);   /* mod date: 1980-01-01 */
  put32(lh + 14, (uint32_t)crc);
  put32(lh + 18, (uint32_t)size); /* compressed = stored */
  put32(lh + 22, (uint32_t)size);
  put16(lh + 26, (uint16_t)strlen(member));
  size_t ml = strlen(member);
  FILE *f = z->af.f;
  if (fwrite(lh, 1, 30, f) != 30 || fwrite(member, 1, ml, f) != ml ||
      (hl && fwrite(hdr, 1, hl, f) != hl) ||
      (dlen && fwrite(data, 1, dlen, f) != dlen)) {
    int e = errno;
    free(member);
    return tsr_errf(err, errlen, e ? -e : TSR_EIO, "%s: write failed: %s",
                    z->af.tmp, strerror(e ? e : EIO));
  }
  npz_entry *en = &z->e[z->n++];
  en->name = member;
  en->crc = (uint32_t)crc;
  en->size = (uint32_t)size;
  en->offset = (uint32_t)z->off;
  z->off += 30 + ml + size;
  return 0;
}

int chief_npz_add_f32(chief_npz *z, const char *name, const int64_t *shape,
                      int rank, const float *data, char *err, size_t errlen) {
  char hdr[640];
  size_t hl = chief_npy_header(hdr, sizeof hdr, shape, rank);
  if (!hl) {
    snprintf(err, errlen, "%s: shape too long for an .npy header", name);
    return TSR_EINVAL;
  }
  uint64_t numel = 1;
  for (int i = 0; i < rank; i++) numel *= (uint64_t)shape[i];
  size_t nl = strlen(name) + 5;
  char *member = malloc(nl);
  if (!member) return TSR_ENOMEM;
  snprintf(member, nl, "%s.npy", name);
  int rc = add_member(z, member, hdr, hl, data, numel * 4, err, errlen);
  free(member);
  return rc;
}

int chief_npz_add_file(chief_npz *z, const char *member, const void *data,
                       size_t len, char *err, size_t errlen) {
  return add_member(z, member, NULL, 0, data, len, err, errlen);
}

static void npz_free(chief_npz *z) {
  for (size_t i = 0; i < z->n; i++) free(z->e[i].name);
  free(z->e);
  free(z);
}

void chief_npz_abort(chief_npz *z) {
  if (!z) return;
  tsr_atomic_abort(&z->af);
  npz_free(z);
}

int chief_npz_close(chief_npz *z, char *err, size_t errlen) {
  uint64_t cd_start = z->off, cd_size = 0;
  FILE *f = z->af.f;
  int bad = 0;
  for (size_t i = 0; i < z->n; i++) {
    npz_entry *en = &z->e[i];
    uint8_t ch[46];
    memset(ch, 0, sizeof ch);
    size_t ml = strlen(en->name);
    put32(ch, 0x02014b50);
    put16(ch + 4, 20);
    put16(ch + 6, 20);
    put16(ch + 14, (1 << 5) | 1);
    put32(ch + 16, en->crc);
    put32(ch + 20, en->size);
    put32(ch + 24, en->size);
    put16(ch + 28, (uint16_t)ml);
    put32(ch + 42, en->offset);
    if (fwrite(ch, 1, 46, f) != 46 || fwrite(en->name, 1, ml, f) != ml)
      bad = 1;
    cd_size += 46 + ml;
  }
  uint8_t eocd[22];
  memset(eocd, 0, sizeof eocd);
  put32(eocd, 0x06054b50);
  put16(eocd + 8, (uint16_t)z->n);
  put16(eocd + 10, (uint16_t)z->n);
  put32(eocd + 12, (uint32_t)cd_size);
  put32(eocd + 16, (uint32_t)cd_start);
  if (fwrite(eocd, 1, 22, f) != 22) bad = 1;
  int rc;
  if (bad) {
    int e = errno;
    rc = tsr_errf(err, errlen, e ? -e : TSR_EIO, "%s: write failed: %s",
                  z->af.tmp, strerror(e ? e : EIO));
    tsr_atomic_abort(&z->af);
  } else {
    /* flush, fsync, close, rename, fsync of the folder */
    rc = tsr_atomic_commit(&z->af, err, errlen);
  }
  npz_free(z);
  return rc;
}
