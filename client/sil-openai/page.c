/* The chat page: chat.html, chat.css and chat.js, embedded at build time with .incbin as the
 * CUDA fatbins are (the Makefile makes this object depend on the files), and their URLs, types
 * and entity tags. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "client/sil-openai/openai.h"

#define EMBED(sym, file)                                                                           \
    __asm__(".pushsection .rodata\n"                                                               \
            ".balign 16\n"                                                                         \
            ".globl " #sym "_start\n"                                                              \
            ".hidden " #sym "_start\n" #sym "_start:\n"                                            \
            ".incbin \"" file "\"\n"                                                               \
            ".globl " #sym "_end\n"                                                                \
            ".hidden " #sym "_end\n" #sym "_end:\n"                                                \
            ".popsection\n");                                                                      \
    extern const char sym##_start[], sym##_end[]

EMBED(sil_oa_chat_html, "client/sil-openai/chat.html");
EMBED(sil_oa_chat_css, "client/sil-openai/chat.css");
EMBED(sil_oa_chat_js, "client/sil-openai/chat.js");

static const struct {
    const char *url, *type, *start, *end;
} files[] = {
    {"/", "text/html; charset=utf-8", sil_oa_chat_html_start, sil_oa_chat_html_end},
    {"/index.html", "text/html; charset=utf-8", sil_oa_chat_html_start, sil_oa_chat_html_end},
    {"/chat.css", "text/css; charset=utf-8", sil_oa_chat_css_start, sil_oa_chat_css_end},
    {"/chat.js", "text/javascript; charset=utf-8", sil_oa_chat_js_start, sil_oa_chat_js_end},
};

int sil_oa_page_file(const char *url, struct sil_oa_page_file *out)
{
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        if (strcmp(url, files[i].url) != 0) continue;
        if (out) {
            out->type = files[i].type;
            out->data = files[i].start;
            out->len = (size_t)(files[i].end - files[i].start);
        }
        return 0;
    }
    return -ENOENT;
}

void sil_oa_page_etag(const struct sil_oa_page_file *f, char *buf, size_t size)
{
    const unsigned char *p = (const unsigned char *)f->data;
    unsigned long long h = 0xcbf29ce484222325ULL; /* FNV-1a 64 */
    for (size_t i = 0; i < f->len; i++)
        h = (h ^ p[i]) * 0x100000001b3ULL;
    snprintf(buf, size, "\"%016llx\"", h);
}
