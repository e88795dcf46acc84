/* Token sampler: logit bias, repetition / presence penalties, then top-k, top-p, min-p,
 * temperature, and a seeded draw (same seed and inputs -> same tokens). temperature <= 0 is greedy
 * (argmax of the biased, penalized logits). */
#ifndef SIL_SAMPLER_H
#define SIL_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

/* Added to one token's logit before anything else (OpenAI's logit_bias). */
struct sil_logit_bias {
    int32_t id;
    float bias;
};

struct sil_sampler_params {
    float temperature;      /* default 0.8; <= 0 greedy */
    int32_t top_k;          /* default 40; <= 0 off */
    float top_p;            /* default 0.95; >= 1 off */
    float min_p;            /* default 0.05; <= 0 off */
    float repeat_penalty;   /* default 1.0 (off); applied to the last repeat_last_n tokens */
    int32_t repeat_last_n;  /* default 64 */
    float presence_penalty; /* default 0.0 (off) */
    uint64_t seed;          /* default 0 = take one from the clock (reported back by the sampler) */
    /* Default none. Not copied: the array must outlive the sampler. Ids outside [0, n_vocab) are
     * ignored; an id given twice gets both biases. */
    const struct sil_logit_bias *logit_bias;
    int32_t n_logit_bias;
};

void sil_sampler_params_default(struct sil_sampler_params *p);

struct sil_sampler;
/* Owns its scratch (n_vocab entries); no allocation per sample. NULL on allocation failure. */
struct sil_sampler *sil_sampler_new(const struct sil_sampler_params *p, int32_t n_vocab);
void sil_sampler_free(struct sil_sampler *s);
uint64_t sil_sampler_seed(const struct sil_sampler *s); /* the seed in use */
/* Picks a token from logits[n_vocab] (not modified) given the tokens generated/seen so far. */
int32_t sil_sampler_sample(struct sil_sampler *s, const float *logits, const int32_t *history,
                           size_t n_history);
/* The distribution sil_sampler_sample draws from for these inputs, over the whole vocabulary:
 * probs[n_vocab] gets each token's probability after the bias, penalties, top-k, top-p, min-p
 * and temperature (0 for the tokens they drop); greedy gives 1 at the argmax. Draws nothing. */
void sil_sampler_probs(struct sil_sampler *s, const float *logits, const int32_t *history,
                       size_t n_history, float *probs);
/* A token drawn from weights w[n_vocab] (>= 0, not necessarily summing to 1) with the sampler's
 * generator; -1 when every weight is 0. */
int32_t sil_sampler_draw(struct sil_sampler *s, const float *w);
/* A number uniform in [0, 1) from the sampler's generator. */
double sil_sampler_uniform(struct sil_sampler *s);
/* 1 when every pick is the argmax of the logits as they come (greedy, no bias or penalty that
 * could change it): the caller may then take the engine's argmax instead of the logits. */
int sil_sampler_plain_greedy(const struct sil_sampler *s);
/* Index of the largest entry, the lowest on ties; NaN never; 0 when all are NaN or -inf; -1
 * when n <= 0. */
int32_t sil_argmax(const float *x, int32_t n);

#endif
