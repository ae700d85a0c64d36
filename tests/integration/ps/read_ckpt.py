"""Reads the shard files written by ckpt_writer with msgpack + numpy only,
as common/ckpt/FORMAT.md describes the layout, checks both CRCs
(CRC32C, computed here) and every value. Exit 77 (skipped) when msgpack or
numpy is not installed."""
import os
import struct
import subprocess
import sys
import tempfile

try:
    import msgpack
    import numpy as np
except ImportError as e:
    print("skipped: %s" % e)
    sys.exit(77)


def crc32c(data):
    crc = 0xFFFFFFFF
    table = crc32c.table
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


crc32c.table = []
for i in range(256):
    c = i
    for _ in range(8):
        c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    crc32c.table.append(c)


def read(path):
    b = open(path, "rb").read()
    assert b[:8] == b"TSRSHARD", "bad magic"
    (hlen,) = struct.unpack("<I", b[8:12])
    (hcrc,) = struct.unpack("<I", b[12 + hlen:16 + hlen])
    assert crc32c(b[12:12 + hlen]) == hcrc, "header crc"
    h = msgpack.unpackb(b[12:12 + hlen], raw=False)
    base = 16 + hlen
    assert len(b) == base + h["data_bytes"], "size"
    assert crc32c(b[base:]) == h["data_crc32c"], "data crc"
    out = {}
    for s in h["sections"]:
        a = np.frombuffer(b, dtype=s["dtype"], offset=base + s["offset"],
                          count=s["nbytes"] // np.dtype(s["dtype"]).itemsize)
        out[s["name"]] = a.reshape(s["shape"])
    return h, out


def main():
    writer = sys.argv[1]
    with tempfile.TemporaryDirectory() as d:
        subprocess.check_call([writer, d])
        h, s = read(os.path.join(d, "dense%2Fw%3A0.part-1-of-2.tshard"))
        assert h["name"] == "dense/w:0" and h["shape"] == [7, 3]
        assert h["row0"] == 4 and h["rows"] == 3 and h["step"] == 9
        assert h["optimizer"] == "adam" and h["slots"] == ["m", "v"]
        assert h["version"] == 2 and h["checkpoint_id"] == "run-7"
        assert h["checkpoint_step"] == 9
        rows = np.arange(4, 7, dtype=np.float32)[:, None]
        want = 0.5 * rows + np.arange(3, dtype=np.float32)[None, :]
        assert np.array_equal(s["value"], want)
        assert np.array_equal(s["slot/m"], -want)
        assert np.array_equal(s["slot/v"], want * want)
        h, s = read(os.path.join(d, "emb.part-0-of-1.tshard"))
        assert h["sparse"] is True and h["n_rows"] == 3
        # rows come in the table's order: row i belongs to ids[i]
        assert sorted(s["ids"]) == [5, 12, 1000000007]
        assert np.array_equal(s["value"][:, 0], s["ids"] % 1000)
        assert np.all(s["value"][:, 1] == -1)
        assert np.all(s["slot/accumulator"] == [0.25, 0.5])
    print("checkpoint files read from Python: ok")


main()
