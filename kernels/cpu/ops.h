/* Element-wise and per-row operations of the forward pass, on F32 rows. Scalar C written so
 * the compiler vectorises it; none of these is a hot spot next to the matmuls. */
#ifndef SIL_OPS_H
#define SIL_OPS_H

#include <stdint.h>

/* y = x / sqrt(mean(x^2) + eps) * w  (w may be NULL: no scale). y may alias x. */
void sil_rmsnorm(float *y, const float *x, const float *w, int64_t n, float eps);
/* NeoX-style rotary embedding of the first n_rot dims of each of n_head heads of head_dim:
 * pairs (i, i + n_rot/2), angle pos * freq_base^(-2i/n_rot). x is [n_head][head_dim]. */
void sil_rope_neox(float *x, int n_head, int head_dim, int n_rot, int32_t pos, float freq_base);
/* In place softmax over n values. */
void sil_softmax(float *x, int64_t n);
/* The unnormalized half of sil_softmax: x[i] = exp(x[i] - max) in place; returns the max and
 * their sum (in double) in *sum. */
float sil_softmax_exp(float *x, int64_t n, double *sum);
float sil_silu(float x);
float sil_sigmoid(float x);
float sil_softplus(float x);
/* out[i] = silu(gate[i]) * up[i] */
void sil_swiglu(float *out, const float *gate, const float *up, int64_t n);
/* y[i] += a * x[i] */
void sil_axpy(float *y, float a, const float *x, int64_t n);
/* y[i] += x[i] */
void sil_add(float *y, const float *x, int64_t n);
float sil_dot_f32(const float *a, const float *b, int64_t n);

#endif
