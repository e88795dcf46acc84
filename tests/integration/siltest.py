"""msgpack-RPC by hand (standard library only) for the integration tests: enough msgpack to
speak siliceo-rpc(7) and to send deliberately broken messages."""
import os
import socket
import struct
import sys
import time


class RawStr(bytes):
    """Packed as a msgpack str holding these bytes as they are (e.g. invalid UTF-8)."""


def pack(o):
    if isinstance(o, RawStr):
        b = bytes(o)
        return b"\xdb" + struct.pack(">I", len(b)) + b
    if o is None:
        return b"\xc0"
    if o is True:
        return b"\xc3"
    if o is False:
        return b"\xc2"
    if isinstance(o, int):
        if 0 <= o < 128:
            return bytes([o])
        if -32 <= o < 0:
            return struct.pack("b", o)
        if 0 <= o < 2**32:
            return b"\xce" + struct.pack(">I", o)
        if 0 <= o < 2**64:
            return b"\xcf" + struct.pack(">Q", o)
        return b"\xd3" + struct.pack(">q", o)
    if isinstance(o, float):
        return b"\xcb" + struct.pack(">d", o)
    if isinstance(o, str):
        b = o.encode()
        if len(b) < 32:
            return bytes([0xA0 | len(b)]) + b
        return b"\xdb" + struct.pack(">I", len(b)) + b
    if isinstance(o, bytes):
        return b"\xc6" + struct.pack(">I", len(o)) + o
    if isinstance(o, (list, tuple)):
        return b"\xdd" + struct.pack(">I", len(o)) + b"".join(pack(x) for x in o)
    if isinstance(o, dict):
        return b"\xdf" + struct.pack(">I", len(o)) + b"".join(pack(k) + pack(v) for k, v in o.items())
    raise TypeError(type(o))


class Incomplete(Exception):
    pass


# Decoding of msgpack str: "replace" by default; a test that checks the daemon sends only valid
# UTF-8 sets "strict", so an invalid byte raises UnicodeDecodeError as strict decoders do.
STR_ERRORS = "replace"


def unpack(b, i=0):
    """Returns (object, next offset); raises Incomplete when b ends early."""
    if i >= len(b):
        raise Incomplete()
    t = b[i]
    i += 1

    def take(n):
        if i + n > len(b):
            raise Incomplete()
        return b[i:i + n]

    if t < 0x80:
        return t, i
    if t >= 0xE0:
        return t - 256, i
    if 0x80 <= t <= 0x8F:
        return _map(b, i, t & 15)
    if 0x90 <= t <= 0x9F:
        return _arr(b, i, t & 15)
    if 0xA0 <= t <= 0xBF:
        n = t & 31
        return take(n).decode("utf-8", STR_ERRORS), i + n
    if t == 0xC0:
        return None, i
    if t == 0xC2:
        return False, i
    if t == 0xC3:
        return True, i
    fixed = {0xCC: ">B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q", 0xD0: ">b", 0xD1: ">h", 0xD2: ">i", 0xD3: ">q",
             0xCA: ">f", 0xCB: ">d"}
    if t in fixed:
        n = struct.calcsize(fixed[t])
        return struct.unpack(fixed[t], take(n))[0], i + n
    if t in (0xD9, 0xDA, 0xDB, 0xC4, 0xC5, 0xC6):
        w = {0xD9: 1, 0xDA: 2, 0xDB: 4, 0xC4: 1, 0xC5: 2, 0xC6: 4}[t]
        n = int.from_bytes(take(w), "big")
        i += w
        if i + n > len(b):
            raise Incomplete()
        raw = b[i:i + n]
        return (raw.decode("utf-8", STR_ERRORS) if t >= 0xD9 else raw), i + n
    if t in (0xDC, 0xDD):
        w = 2 if t == 0xDC else 4
        n = int.from_bytes(take(w), "big")
        return _arr(b, i + w, n)
    if t in (0xDE, 0xDF):
        w = 2 if t == 0xDE else 4
        n = int.from_bytes(take(w), "big")
        return _map(b, i + w, n)
    raise ValueError("unsupported msgpack type 0x%02x" % t)


def _arr(b, i, n):
    out = []
    for _ in range(n):
        o, i = unpack(b, i)
        out.append(o)
    return out, i


def _map(b, i, n):
    out = {}
    for _ in range(n):
        k, i = unpack(b, i)
        v, i = unpack(b, i)
        out[k] = v
    return out, i


class Client:
    def __init__(self, path=None, timeout=60):
        self.path = path or os.environ["SILICEO_SOCKET"]
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(timeout)
        self.s.connect(self.path)
        self.buf = b""
        self.next_id = 1
        self.notes = []

    def close(self):
        self.s.close()

    def send_raw(self, data):
        self.s.sendall(data)

    def send(self, method, params=None, msgid=None):
        if msgid is None:
            msgid = self.next_id
            self.next_id += 1
        self.send_raw(pack([0, msgid, method, {} if params is None else params]))
        return msgid

    def read(self):
        """The next message, or None when the daemon closed the connection."""
        while True:
            if self.buf:
                try:
                    o, n = unpack(self.buf)
                    self.buf = self.buf[n:]
                    return o
                except Incomplete:
                    pass
            try:
                d = self.s.recv(65536)
            except ConnectionResetError:
                d = b""
            if not d:
                return None
            self.buf += d

    def wait(self, msgid, on_note=None):
        """Reads until the response to msgid; returns (error, result, notifications for msgid).
        What arrived for msgid while another was waited for (put aside in notes) counts first."""
        notes = []
        kept = []
        for m in self.notes:
            p = m[2][0] if m[0] == 2 and isinstance(m[2], list) and m[2] else m[2]
            if m[0] == 2 and isinstance(p, dict) and p.get("id") == msgid:
                notes.append(p)
                if on_note:
                    on_note(p)
            elif m[0] == 1 and m[1] == msgid:
                self.notes = kept + self.notes[self.notes.index(m) + 1:]
                return m[2], m[3], notes
            else:
                kept.append(m)
        self.notes = kept
        while True:
            m = self.read()
            if m is None:
                raise EOFError("connection closed while waiting for %d" % msgid)
            if m[0] == 2:
                p = m[2][0] if isinstance(m[2], list) and m[2] else m[2]
                if isinstance(p, dict) and p.get("id") == msgid:
                    notes.append(p)
                    if on_note:
                        on_note(p)
                else:
                    self.notes.append(m)
            elif m[0] == 1 and m[1] == msgid:
                return m[2], m[3], notes
            else:
                self.notes.append(m)

    def call(self, method, params=None):
        err, res, notes = self.wait(self.send(method, params))
        return err, res, notes

    def ok(self, method, params=None):
        err, res, notes = self.call(method, params)
        if err is not None:
            raise RuntimeError("%s: %r" % (method, err))
        return res, notes


def check(cond, what):
    if not cond:
        print("FAIL:", what, file=sys.stderr)
        sys.exit(1)
    print("ok:", what)


def wait_socket(path, timeout=30):
    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            c = Client(path, timeout=5)
            c.close()
            return True
        except OSError:
            time.sleep(0.05)
    return False
