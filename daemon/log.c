#include "daemon/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static atomic_int log_level = SIL_LOG_INFO;
static int to_journal;

/* JOURNAL_STREAM is "dev:ino" of the journal's stream; it counts only if stderr is that stream. */
static int stderr_is_journal(void)
{
    const char *js = getenv("JOURNAL_STREAM");
    unsigned long long dev, ino;
    struct stat st;
    if (!js || sscanf(js, "%llu:%llu", &dev, &ino) != 2 || fstat(STDERR_FILENO, &st) < 0)
        return 0;
    return st.st_dev == dev && st.st_ino == ino;
}

void sil_log_init(int level)
{
    to_journal = stderr_is_journal();
    sil_log_set_level(level);
}

void sil_log_set_level(int level) { atomic_store(&log_level, level); }
int sil_log_level(void) { return atomic_load(&log_level); }

void sil_log(int level, const char *fmt, ...)
{
    if (level > atomic_load(&log_level))
        return;
    char line[1024];
    int n;
    if (to_journal)
        n = snprintf(line, sizeof line, "<%d>", level);
    else
        n = snprintf(line, sizeof line, "siliceod: %s: ", sil_log_level_name(level));
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - n - 1, fmt, ap);
    va_end(ap);
    if (m < 0)
        return;
    n += m;
    if (n > (int)sizeof line - 2)
        n = sizeof line - 2;
    line[n++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, n);
    (void)w;
}
