"""Reads a GGUF's tensors back into the PyTorch model: F32 as is, Q8_0 dequantized
(d * q per block of 32), so PyTorch can run the very weights a quantized file holds.
Other types raise. numpy + the standard library.
"""

import struct

import numpy as np

F32, F16, Q8_0 = 0, 1, 8
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
           12: "d"}


class _R:
    def __init__(self, buf):
        self.b, self.o = buf, 0

    def take(self, fmt):
        v = struct.unpack_from("<" + fmt, self.b, self.o)
        self.o += struct.calcsize("<" + fmt)
        return v[0] if len(v) == 1 else v

    def str(self):
        n = self.take("Q")
        s = self.b[self.o:self.o + n].decode("utf-8", errors="replace")
        self.o += n
        return s

    def value(self, t):
        if t == 8:
            return self.str()
        if t == 9:
            et, n = self.take("I"), self.take("Q")
            return [self.value(et) for _ in range(n)]
        return self.take(_SCALAR[t])


def read(path):
    """(metadata dict, {name: numpy float32 array in torch order, i.e. ne reversed})."""
    with open(path, "rb") as f:
        buf = f.read()
    r = _R(buf)
    if r.take("I") != 0x46554747:
        raise ValueError(f"{path}: not a GGUF file")
    r.take("I")
    n_t, n_kv = r.take("Q"), r.take("Q")
    meta = {}
    for _ in range(n_kv):
        k = r.str()
        meta[k] = r.value(r.take("I"))
    infos = []
    for _ in range(n_t):
        name = r.str()
        nd = r.take("I")
        ne = [r.take("Q") for _ in range(nd)]
        infos.append((name, ne, r.take("I"), r.take("Q")))
    align = meta.get("general.alignment", 32)
    base = (r.o + align - 1) // align * align
    out = {}
    for name, ne, typ, off in infos:
        n = int(np.prod(ne))
        at = base + off
        if typ == F32:
            a = np.frombuffer(buf, "<f4", n, at)
        elif typ == F16:
            a = np.frombuffer(buf, "<f2", n, at).astype(np.float32)
        elif typ == Q8_0:
            blk = np.frombuffer(buf, np.dtype([("d", "<f2"), ("q", "i1", 32)]), n // 32, at)
            a = (blk["d"].astype(np.float32)[:, None] * blk["q"].astype(np.float32)).reshape(-1)
        else:
            raise ValueError(f"{path}: tensor {name} has type {typ}, only F32/F16/Q8_0 are read")
        out[name] = a.reshape(list(reversed(ne))).copy()
    return meta, out


def load_into(model, path):
    """Copies the file's tensors into model (GGUF names); shapes must agree."""
    import torch
    _, ts = read(path)
    with torch.no_grad():
        for name, p in model.named_gguf():
            a = ts[name]
            p.copy_(torch.from_numpy(a).reshape(p.shape))
    return model
