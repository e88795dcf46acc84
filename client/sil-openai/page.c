/* The chat page: chat.html, embedded at build time with .incbin as the CUDA fatbins are (the
 * Makefile makes this object depend on the file), and the headers it is served with. */
#include <stdio.h>

#include "client/sil-openai/openai.h"

__asm__(".pushsection .rodata\n"
        ".balign 16\n"
        ".globl sil_oa_page_start\n"
        ".hidden sil_oa_page_start\n"
        "sil_oa_page_start:\n"
        ".incbin \"client/sil-openai/chat.html\"\n"
        ".globl sil_oa_page_end\n"
        ".hidden sil_oa_page_end\n"
        "sil_oa_page_end:\n"
        ".popsection\n");
extern const char sil_oa_page_start[], sil_oa_page_end[];

const char *sil_oa_page(size_t *len)
{
    *len = (size_t)(sil_oa_page_end - sil_oa_page_start);
    return sil_oa_page_start;
}

void sil_oa_page_etag(char *buf, size_t size)
{
    size_t len;
    const unsigned char *p = (const unsigned char *)sil_oa_page(&len);
    unsigned long long h = 0xcbf29ce484222325ULL; /* FNV-1a 64 */
    for (size_t i = 0; i < len; i++)
        h = (h ^ p[i]) * 0x100000001b3ULL;
    snprintf(buf, size, "\"%016llx\"", h);
}
