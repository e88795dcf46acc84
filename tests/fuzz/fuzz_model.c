/* Fuzzes model loading (hyperparameters, tensor binding, inspect output) and, for inputs that
 * load, a short forward pass: whatever the file says, the engine either refuses it with an
 * error or evaluates it without crashing. Seed: a 2-layer qwen35moe from sil-mkmodel. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "daemon/engine/engine.h"
#include "daemon/engine/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct sil_error err = {0};
    struct sil_model *m = NULL;
    if (sil_model_load_mem(&m, data, size, "fuzz.gguf", &err) != 0)
        return 0;
    FILE *null = fopen("/dev/null", "w");
    if (null) {
        sil_model_print(m, null);
        fclose(null);
    }
    sil_model_free(m);

    /* the engine opens files by path: give it the bytes through a memfd */
    int fd = memfd_create("fuzz-model", 0);
    if (fd < 0)
        return 0;
    if (write(fd, data, size) == (ssize_t)size) {
        char path[64];
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
        struct sil_engine_params p;
        sil_engine_params_default(&p);
        p.model_path = path;
        p.n_threads = 1;
        p.n_ctx = 16;
        p.n_seq_max = 1;
        p.n_batch_max = 8;
        struct sil_engine *e = NULL;
        if (sil_engine_open(&e, &p, &err) == 0) {
            int32_t n_vocab = sil_engine_info(e)->n_vocab;
            int seq = sil_seq_create(e, &err);
            int32_t tok[3] = {0, (int32_t)(size % (size_t)n_vocab), n_vocab - 1}, pos[3] = {0, 1, 2};
            int32_t sq[3] = {seq, seq, seq};
            struct sil_batch b = {3, tok, pos, sq, NULL};
            float *logits = malloc(sizeof(float) * (size_t)n_vocab);
            if (seq >= 0 && logits)
                sil_engine_eval(e, &b, logits, &err);
            free(logits);
            sil_engine_close(e);
        }
    }
    close(fd);
    return 0;
}
