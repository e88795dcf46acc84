#include "tests/testutil_json.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "tests/testutil.h"

/* The Makefile links bench sources only into the bench binaries: compiled here for the tests. */
#include "bench/sil-mkmodel/mkmodel.h"

struct sil_json_doc *tu_json_load(const char *rel)
{
    if (!tu_refdata_exists(rel))
        return NULL;
    char *path = tu_refdata_path(rel);
    void *buf = NULL;
    size_t len = 0;
    assert_int_equal(tu_read_file(path, &buf, &len), 0);
    struct sil_json_doc *d = NULL;
    struct sil_error err = {0};
    if (sil_json_parse(&d, buf, len, rel, &err) < 0)
        fail_msg("%s", err.msg);
    free(buf);
    free(path);
    return d;
}
