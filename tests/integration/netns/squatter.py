"""A local user without the cluster token who sits on the same-host socket
names of a Tessera cluster and relays what reaches them, changing what it
can.

    squatter.py unix|tcp IP:PORT...

For every IP:PORT it binds the abstract name tessera-rpc/IP:PORT (the
name a client of IP:PORT tries first); with `tcp` it binds
tessera-rpc/any:PORT too (the wildcard name, so it must run before the
server does). Each connection it accepts is relayed: with `unix` to the
server's own wildcard socket tessera-rpc/any:PORT, with `tcp` to IP:PORT.
The handshake passes through untouched (it holds no token); after it,
every request frame with a payload has the sign of each float32 in the
payload flipped (pushed gradients move the weights the wrong way). Frames
with a MAC are changed all the same: the receiver must notice.

It prints one line per event, flushed, for the test to count:
    listening NAME
    accepted NAME
    relay NAME plain|mac
    tampered NAME plain|mac N       (N frames so far on that connection)
"""
import asyncio
import socket
import struct
import sys

HELLO = 8 + 32 + 32          # magic, version, role, flags, nonce, name
C2S_HS = HELLO + 32          # HELLO + PROOF
S2C_HS = HELLO + 4 + 32      # HELLO + VERDICT
HEADER = 32
TAG = 16
PLAIN_FLAG = 0x01


def say(*a):
    print(*a, flush=True)


def abstract(name):
    return "\0" + name


class Conn:
    def __init__(self, name):
        self.name = name
        self.c_flags = None
        self.s_flags = None
        self.tampered = 0

    def plain(self):
        return bool(self.c_flags is not None and self.s_flags is not None and
                    self.c_flags & PLAIN_FLAG and self.s_flags & PLAIN_FLAG)


async def server_to_client(conn, sr, cw):
    buf = b""
    got_flags = False
    try:
        while True:
            data = await sr.read(1 << 16)
            if not data:
                break
            if not got_flags:
                buf += data
                if len(buf) >= 8:
                    conn.s_flags = buf[7]
                    got_flags = True
                    data, buf = buf, b""
                else:
                    continue
            cw.write(data)
            await cw.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        cw.close()


async def client_to_server(conn, cr, sw):
    buf = bytearray()
    hs_left = C2S_HS
    try:
        while True:
            data = await cr.read(1 << 16)
            if not data:
                break
            buf += data
            if conn.c_flags is None and len(buf) >= 8:
                conn.c_flags = buf[7]
            out = bytearray()
            if hs_left:
                n = min(hs_left, len(buf))
                out += buf[:n]
                del buf[:n]
                hs_left -= n
            while not hs_left and len(buf) >= HEADER:
                if conn.s_flags is None:
                    break        # the server's HELLO says whether tags follow
                meta = struct.unpack_from("<I", buf, 12)[0]
                pay = struct.unpack_from("<Q", buf, 24)[0]
                tag = 0 if conn.plain() else TAG
                flen = HEADER + meta + pay + tag
                if len(buf) < flen:
                    break
                frame = buf[:flen]
                del buf[:flen]
                if frame[5] == 1 and pay and pay % 4 == 0:  # a request
                    start = HEADER + meta
                    for i in range(start + 3, start + pay, 4):
                        frame[i] ^= 0x80
                    conn.tampered += 1
                    if conn.tampered in (1, 10, 100, 1000, 10000):
                        say("tampered", conn.name,
                            "plain" if conn.plain() else "mac", conn.tampered)
                out += frame
            if out:
                sw.write(bytes(out))
                await sw.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        sw.close()


def handler(name, target):
    async def handle(cr, cw):
        say("accepted", name)
        try:
            if target[0] == "unix":
                sr, sw = await asyncio.open_unix_connection(target[1])
            else:
                sr, sw = await asyncio.open_connection(target[1], target[2])
        except OSError:
            cw.close()
            return
        conn = Conn(name)
        t1 = asyncio.ensure_future(client_to_server(conn, cr, sw))
        t2 = asyncio.ensure_future(server_to_client(conn, sr, cw))
        # report the mode once both HELLOs passed
        for _ in range(200):
            if conn.c_flags is not None and conn.s_flags is not None:
                say("relay", name, "plain" if conn.plain() else "mac")
                break
            if t1.done() or t2.done():
                break
            await asyncio.sleep(0.01)
        await asyncio.gather(t1, t2)
    return handle


async def main():
    mode, addrs = sys.argv[1], sys.argv[2:]
    servers = []
    for a in addrs:
        ip, port = a.rsplit(":", 1)
        names = ["tessera-rpc/%s:%s" % (ip, port)]
        if mode == "tcp":
            names.append("tessera-rpc/any:%s" % port)
            target = ("tcp", ip, int(port))
        else:
            target = ("unix", abstract("tessera-rpc/any:%s" % port))
        for n in names:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.bind(abstract(n))
            s.listen(64)
            servers.append(await asyncio.start_unix_server(
                handler("@" + n, target), sock=s))
            say("listening", "@" + n)
    await asyncio.Event().wait()


asyncio.run(main())
