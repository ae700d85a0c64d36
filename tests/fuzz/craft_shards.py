"""Writes the crafted shard files of tests/fuzz/corpus/fuzz_ckpt_shard/
(the regress-* entries) from its real seeds: each a file with valid CRCs
that the shard file library must refuse by name (a sections list that is
not the one the header implies, a header key twice, slot names twice,
values training cannot leave, an id past a bounded table). The suite
replays them (fuzz_corpus_ckpt_shard); tests/unit/ps/test_crafted.c makes
the same kinds of file and checks each message.

Usage: /usr/bin/python3 tests/fuzz/craft_shards.py (needs msgpack)."""
import os
import struct

import msgpack

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus",
                    "fuzz_ckpt_shard")


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def load(seed):
    b = open(os.path.join(HERE, seed), "rb").read()
    (hlen,) = struct.unpack("<I", b[8:12])
    pairs = msgpack.unpackb(b[12:12 + hlen], raw=False,
                            object_pairs_hook=list)
    # the header's own keys keep their order; each section is a map
    pairs = [(k, [dict(x) for x in v] if k == "sections" else v)
             for k, v in pairs]
    return pairs, bytearray(b[16 + hlen:])


def save(name, pairs, data, extra=None):
    """pairs: the header's (key, value) list; extra: one more pair packed
    after them (a key twice)."""
    data = bytes(data)
    pk = msgpack.Packer(use_bin_type=True)
    items = [(k, crc32c(data) if k == "data_crc32c" else v) for k, v in pairs]
    if extra:
        items.append(extra)
    h = pk.pack_map_header(len(items))
    for k, v in items:
        h += pk.pack(k) + pk.pack(v)
    out = b"TSRSHARD" + struct.pack("<I", len(h)) + h
    out += struct.pack("<I", crc32c(h)) + data
    open(os.path.join(HERE, name), "wb").write(out)


def get(pairs, key):
    return dict(pairs)[key]


def with_key(pairs, key, value):
    return [(k, value if k == key else v) for k, v in pairs]


def sections(pairs):
    return [dict(s) for s in get(pairs, "sections")]  # copies


def main():
    # dense Adam [8, 4]: value, slot/m, slot/v (128 bytes each)
    h, d = load("dense_adam")
    s = sections(h)
    s[0]["nbytes"] = 1 << 63
    save("regress-section-nbytes-2p63", with_key(h, "sections", s), d)
    s = sections(h)
    s[0]["dtype"] = "<f8"
    save("regress-section-dtype-f8", with_key(h, "sections", s), d)
    s = sections(h)
    s[2]["offset"] = 1 << 40
    save("regress-section-offset-past", with_key(h, "sections", s), d)
    s = sections(h)
    save("regress-section-twice", with_key(h, "sections", s + [s[0]]), d)
    save("regress-section-missing", with_key(h, "sections", s[:2]), d)
    s[1]["name"] = "value"
    save("regress-section-name-twice", with_key(h, "sections", s), d)
    save("regress-header-key-twice", h, d, ("sections", sections(h)[:1]))
    slots = get(h, "slots")
    s = sections(h)
    s[2]["name"] = "slot/m"
    save("regress-slots-twice",
         with_key(with_key(h, "slots", [slots[0], slots[0]]), "sections", s),
         d)
    nan = bytearray(d)
    nan[20:24] = struct.pack("<f", float("nan"))
    save("regress-value-nan", h, nan)
    neg = bytearray(d)
    neg[256:260] = struct.pack("<f", -0.5)
    save("regress-v-negative", h, neg)
    # bounded sparse Adagrad [64, 4]: ids (2 rows), value, accumulator
    h, d = load("sparse_bounded_adagrad")
    neg = bytearray(d)
    neg[16 + 32:16 + 36] = struct.pack("<f", -0.25)
    save("regress-accumulator-negative", h, neg)
    past = bytearray(d)
    past[0:8] = struct.pack("<q", get(h, "shape")[0])
    save("regress-bounded-id-past", h, past)
    print("crafted shard files written under %s" % HERE)


main()
