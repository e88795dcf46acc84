/* Fuzzes the incremental unpacker (fed in chunks whose sizes come from the input), the RPC
 * shape checks, the typed getters and the JSON writer. A small max_msg keeps memory bounded;
 * one-shot decode of every complete message must agree with the unpacker. */
#include "siliceo-proto.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static FILE *devnull;

static void poke_fields(const msgpack_object *map)
{
    static const char *keys[] = {"prompt", "max_tokens", "temperature", "think", "messages",
                                 "stop", "id", "text", "ids", "session", ""};
    struct sil_rpc_error e;
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        const char *s;
        size_t n;
        char buf[32];
        int64_t iv;
        uint64_t uv;
        double dv;
        bool bv;
        const msgpack_object *o;
        unsigned fl = (unsigned)i % 4;
        sil_rpc_get_str(map, keys[i], &s, &n, fl, &e);
        sil_rpc_get_strbuf(map, keys[i], buf, sizeof(buf), fl, &e);
        sil_rpc_get_int(map, keys[i], -5, 1000, &iv, fl, &e);
        sil_rpc_get_uint(map, keys[i], 1, UINT64_MAX, &uv, fl, &e);
        sil_rpc_get_double(map, keys[i], 0, 2, &dv, fl, &e);
        sil_rpc_get_bool(map, keys[i], &bv, fl, &e);
        sil_rpc_get_map(map, keys[i], &o, fl, &e);
        if (sil_rpc_get_array(map, keys[i], &o, fl, &e) == 1) {
            for (uint32_t k = 0; k < o->via.array.size && k < 4; k++)
                sil_rpc_get_str(&o->via.array.ptr[k], "role", &s, &n, SIL_RPC_REQUIRED, &e);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!devnull)
        devnull = fopen("/dev/null", "w");
    if (size < 2)
        return 0;
    size_t max_msg = 64 + (size_t)data[0] * 64; /* 64 .. 16 KiB */
    unsigned depth = 1 + data[1] % 40;          /* also beyond the hard ceiling */
    data += 2;
    size = size - 2;

    struct sil_rpc_unpacker *u = sil_rpc_unpacker_new(max_msg, depth);
    if (!u)
        return 0;
    struct sil_rpc_error e;
    size_t pos = 0;
    uint32_t rng = (uint32_t)size * 2654435761u;
    int r = 0;
    while (pos < size && r >= 0) {
        rng = rng * 1103515245u + 12345u;
        size_t chunk = 1 + (rng >> 16) % 97;
        if (chunk > size - pos)
            chunk = size - pos;
        if (sil_rpc_unpacker_feed(u, data + pos, chunk, &e) < 0)
            break;
        pos += chunk;
        struct sil_rpc_msg m;
        while ((r = sil_rpc_unpacker_next(u, &m, &e)) != 0) {
            if (r == -EPROTO) {
                if (m.priv_)
                    abort(); /* a rejected message must not hold memory */
                r = 0;
                continue;
            }
            if (r < 0)
                break;
            if (m.size > max_msg)
                abort();
            if (m.type == SIL_RPC_REQUEST || m.type == SIL_RPC_NOTIFICATION) {
                if (m.method[0] == 0 || strlen(m.method) >= SIL_RPC_METHOD_MAX)
                    abort();
                poke_fields(m.params);
            } else if (m.type == SIL_RPC_RESPONSE) {
                struct sil_rpc_error re;
                sil_rpc_read_error(m.error, &re);
                poke_fields(m.result);
            } else {
                abort();
            }
            if (devnull)
                sil_rpc_print_json(devnull, &m.root, (int)(rng % 3) - 1);
            sil_rpc_msg_release(&m);
        }
    }
    sil_rpc_unpacker_free(u);

    /* One-shot decode of the whole input: never crashes, and its result is consistent. */
    struct sil_rpc_msg m;
    r = sil_rpc_decode(data, size, max_msg, depth, &m, &e);
    if (r == 1) {
        if (m.size != size)
            abort();
        sil_rpc_msg_release(&m);
    } else if (r > 1 || r == 0) {
        abort();
    }
    return 0;
}
