/* bf16 CPU kernels for a decode step: attention of one new token per sequence over its
 * workspace, RMSNorm, and the linear layers' products for a few rows. Built once per machine by tieredkv/model/cpu_kernels.py (gcc -O3
 * -march=native -fopenmp) and called through ctypes; OpenMP here is the runtime torch already
 * loaded (same soname), so both share one thread pool.
 *
 * bf16 values travel as uint16_t: the top half of an fp32. Arithmetic is fp32. */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#define MAX_GROUP 16 /* query heads per kv head */
#define MAX_DIM 256  /* head dim */
#define CHUNK 256    /* keys a work unit scores: sequences x kv heads x chunks run in parallel */

static inline float bf16_to_f32(uint16_t x) {
    uint32_t bits = (uint32_t)x << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint16_t f32_to_bf16(float f) { /* round to nearest even, as torch does */
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u); /* NaN */
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

/* e^x for x <= 0 (a softmax's shifted scores), as plain arithmetic the compiler vectorizes:
 * x = n ln2 + r with |r| <= ln2/2, e^r by its degree-6 Taylor polynomial (relative error
 * below 2e-7, under fp32's own rounding of the sum it feeds), 2^n through the exponent bits;
 * 0 below -87 (a masked score's -inf included). */
static inline float exp_nonpositive(float x) {
    const float zero_below = -87.0f; /* e^-87 ~ 1.6e-38: nothing beside the maximum's 1 */
    const int underflows = x < zero_below; /* a masked -inf among them */
    x = underflows ? zero_below : x;
    const float shifter = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    const float n = (x * 1.44269504088896341f + shifter) - shifter;
    const float r = x - n * 0.693145751953125f - n * 1.428606765330187e-06f;
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return underflows ? 0.0f : p * scale;
}

/* One row of the per-sequence table the caller builds once a step (int64 each). */
enum {
    SEQ_ROW,          /* the sequence's row in q, k_new, v_new and out */
    SEQ_KEYS,         /* address of layer 0's keys, kv head 0, token 0 (bf16) */
    SEQ_VALUES_AT,    /* elements from a layer's keys to its values */
    SEQ_LAYER_STRIDE, /* elements from one layer's keys to the next layer's */
    SEQ_HEAD_STRIDE,  /* elements from one kv head's tokens to the next head's */
    SEQ_LENGTH,       /* tokens including the new one, which goes to position LENGTH - 1 */
    SEQ_FIELDS
};

typedef struct {
    int64_t seq, head, lo, hi;
} Unit;

/* A unit's scores of each query -> e^(score - the unit's max) in place; (max, sum) of each
 * query go to partial[g * stride] and partial[g * stride + 1]. */
static inline void exp_scores(float scores[MAX_GROUP][CHUNK], int64_t n, int64_t group,
                              float *partial, int64_t stride) {
    for (int64_t g = 0; g < group; g++) {
        float top = -INFINITY, sum = 0.0f;
#pragma omp simd reduction(max : top)
        for (int64_t j = 0; j < n; j++) top = scores[g][j] > top ? scores[g][j] : top;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < n; j++) {
            scores[g][j] = exp_nonpositive(scores[g][j] - top);
            sum += scores[g][j];
        }
        partial[g * stride] = top;
        partial[g * stride + 1] = sum;
    }
}

/* One work unit: its keys' scores for the kv head's `group` queries, their softmax weights
 * relative to the unit's own maximum, and the weighted sum of its values, into `partial`:
 * (max, sum, acc[dim]) per query. Inlined with `dim` and `group` constant where they are the
 * common ones, so the inner loops unroll into whole vectors. */
static inline __attribute__((always_inline)) void attend_unit(
    const uint16_t *keys, const uint16_t *values, int64_t n, const uint16_t *query_rows,
    int64_t q_head_stride, float scale, const int64_t dim, const int64_t group, float *partial) {
    float queries[MAX_GROUP][MAX_DIM], scores[MAX_GROUP][CHUNK], row[MAX_DIM];
    for (int64_t g = 0; g < group; g++) {
        for (int64_t d = 0; d < dim; d++)
            queries[g][d] = bf16_to_f32(query_rows[g * q_head_stride + d]) * scale;
    }
    for (int64_t j = 0; j < n; j++) {
        const uint16_t *key = keys + j * dim;
        for (int64_t d = 0; d < dim; d++) row[d] = bf16_to_f32(key[d]);
        for (int64_t g = 0; g < group; g++) {
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int64_t d = 0; d < dim; d++) dot += queries[g][d] * row[d];
            scores[g][j] = dot;
        }
    }
    exp_scores(scores, n, group, partial, dim + 2);
    for (int64_t g = 0; g < group; g++)
        memset(partial + g * (dim + 2) + 2, 0, sizeof(float) * (size_t)dim);
    for (int64_t j = 0; j < n; j++) {
        const uint16_t *value = values + j * dim;
        for (int64_t d = 0; d < dim; d++) row[d] = bf16_to_f32(value[d]);
        for (int64_t g = 0; g < group; g++) {
            float *acc = partial + g * (dim + 2) + 2;
            const float p = scores[g][j];
#pragma omp simd
            for (int64_t d = 0; d < dim; d++) acc[d] += p * row[d];
        }
    }
}

#if defined(__AVX512F__)
/* 16 bf16 (their bits) in a register -> 16 floats (a bf16 is the top half of its float). */
static inline __m512 widen_bf16_bits(__m256i packed) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(packed), 16));
}

/* 16 bf16 values in memory -> 16 floats. */
static inline __m512 widen_bf16(const uint16_t *src) {
    return widen_bf16_bits(_mm256_loadu_si256((const __m256i *)src));
}

#if defined(__AVX512BF16__)
/* Two vectors' halves summed: [a's 8 block sums | b's 8], for `sum_each`. */
static inline __m512 sum_halves(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
}

/* Lane i of the result = the sum of v[i]'s 16 lanes: a tree of shuffles and adds over all 16
 * at once (15 adds where one reduction per vector takes four each, with their shuffles). */
static inline __m512 sum_each(const __m512 v[16]) {
    __m512 pairs[8], quads[4], eights[2];
    for (int i = 0; i < 8; i++) pairs[i] = sum_halves(v[2 * i], v[2 * i + 1]);
    for (int i = 0; i < 4; i++) /* 128-bit block k of quads[i]: vector 4i + k's 4 sums */
        quads[i] = _mm512_add_ps(
            _mm512_shuffle_f32x4(pairs[2 * i], pairs[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
            _mm512_shuffle_f32x4(pairs[2 * i], pairs[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    for (int i = 0; i < 2; i++) /* block k: vectors 8i + k and 8i + 4 + k, two sums each */
        eights[i] = _mm512_add_ps(
            _mm512_shuffle_ps(quads[2 * i], quads[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
            _mm512_shuffle_ps(quads[2 * i], quads[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* lane 4k + m: vector k + 4m */
    const __m512 sums = _mm512_add_ps(
        _mm512_shuffle_ps(eights[0], eights[1], _MM_SHUFFLE(2, 0, 2, 0)),
        _mm512_shuffle_ps(eights[0], eights[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(order, sums);
}
#endif

/* A 64-dim unit's weighted sum of values for `group` queries (a constant where inlined): each
 * value widened once for all of them, each query's sums in four registers, summed over the
 * keys in order (as one query at a time would). */
static inline __attribute__((always_inline)) void weigh_values(
    const uint16_t *values, int64_t n, float scores[MAX_GROUP][CHUNK], const int64_t group,
    float *partial) {
    __m512 acc[4][4];
    for (int64_t g = 0; g < group; g++)
        for (int64_t c = 0; c < 4; c++) acc[g][c] = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j++) {
        const uint16_t *value = values + j * 64;
        const __m512 v0 = widen_bf16(value), v1 = widen_bf16(value + 16);
        const __m512 v2 = widen_bf16(value + 32), v3 = widen_bf16(value + 48);
        for (int64_t g = 0; g < group; g++) {
            const __m512 p = _mm512_set1_ps(scores[g][j]);
            acc[g][0] = _mm512_fmadd_ps(p, v0, acc[g][0]);
            acc[g][1] = _mm512_fmadd_ps(p, v1, acc[g][1]);
            acc[g][2] = _mm512_fmadd_ps(p, v2, acc[g][2]);
            acc[g][3] = _mm512_fmadd_ps(p, v3, acc[g][3]);
        }
    }
    for (int64_t g = 0; g < group; g++)
        for (int64_t c = 0; c < 4; c++) _mm512_storeu_ps(partial + g * 66 + 2 + c * 16, acc[g][c]);
}

/* The same unit for 64-dim heads on an AVX512 CPU. The scores: with the bf16 dot instruction
 * (pairs of bf16 products summed in fp32) where the CPU has AVX512-BF16; else each key widened
 * to fp32 once, in four registers, for all the group's queries (each key is read once for
 * the whole group instead of once per query). The values' weighted sum in registers. */
static void attend_unit_avx512(const uint16_t *keys, const uint16_t *values, int64_t n,
                               const uint16_t *query_rows, int64_t q_head_stride, float scale,
                               const int64_t group, float *partial) {
    float scores[MAX_GROUP][CHUNK];
#if defined(__AVX512BF16__)
    for (int64_t g = 0; g < group; g++) {
        const uint16_t *query = query_rows + g * q_head_stride;
        const __m512bh q_lo = (__m512bh)_mm512_loadu_si512(query);
        const __m512bh q_hi = (__m512bh)_mm512_loadu_si512(query + 32);
        int64_t j = 0;
        for (; j + 16 <= n; j += 16) {
            __m512 dots[16];
            for (int64_t t = 0; t < 16; t++) {
                const uint16_t *key = keys + (j + t) * 64;
                dots[t] = _mm512_dpbf16_ps(_mm512_setzero_ps(), q_lo,
                                           (__m512bh)_mm512_loadu_si512(key));
                dots[t] = _mm512_dpbf16_ps(dots[t], q_hi, (__m512bh)_mm512_loadu_si512(key + 32));
            }
            _mm512_storeu_ps(scores[g] + j, _mm512_mul_ps(sum_each(dots), _mm512_set1_ps(scale)));
        }
        for (; j < n; j++) {
            const uint16_t *key = keys + j * 64;
            __m512 dot = _mm512_dpbf16_ps(_mm512_setzero_ps(), q_lo,
                                          (__m512bh)_mm512_loadu_si512(key));
            dot = _mm512_dpbf16_ps(dot, q_hi, (__m512bh)_mm512_loadu_si512(key + 32));
            scores[g][j] = _mm512_reduce_add_ps(dot) * scale;
        }
    }
#else
    float queries[MAX_GROUP][64];
    for (int64_t g = 0; g < group; g++) {
        for (int64_t d = 0; d < 64; d++)
            queries[g][d] = bf16_to_f32(query_rows[g * q_head_stride + d]) * scale;
    }
    for (int64_t j = 0; j < n; j++) {
        const uint16_t *key = keys + j * 64;
        const __m512 k0 = widen_bf16(key), k1 = widen_bf16(key + 16);
        const __m512 k2 = widen_bf16(key + 32), k3 = widen_bf16(key + 48);
        for (int64_t g = 0; g < group; g++) {
            const float *query = queries[g];
            __m512 dot = _mm512_mul_ps(_mm512_loadu_ps(query), k0);
            dot = _mm512_fmadd_ps(_mm512_loadu_ps(query + 16), k1, dot);
            dot = _mm512_fmadd_ps(_mm512_loadu_ps(query + 32), k2, dot);
            dot = _mm512_fmadd_ps(_mm512_loadu_ps(query + 48), k3, dot);
            scores[g][j] = _mm512_reduce_add_ps(dot);
        }
    }
#endif
    exp_scores(scores, n, group, partial, 66);
    switch (group) { /* up to four queries' sums fit in registers beside a widened value */
    case 1: weigh_values(values, n, scores, 1, partial); return;
    case 2: weigh_values(values, n, scores, 2, partial); return;
    case 3: weigh_values(values, n, scores, 3, partial); return;
    case 4: weigh_values(values, n, scores, 4, partial); return;
    default: break;
    }
    for (int64_t g = 0; g < group; g++) {
        __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
        for (int64_t j = 0; j < n; j++) {
            const uint16_t *value = values + j * 64;
            const __m512 p = _mm512_set1_ps(scores[g][j]);
            acc0 = _mm512_fmadd_ps(p, widen_bf16(value), acc0);
            acc1 = _mm512_fmadd_ps(p, widen_bf16(value + 16), acc1);
            acc2 = _mm512_fmadd_ps(p, widen_bf16(value + 32), acc2);
            acc3 = _mm512_fmadd_ps(p, widen_bf16(value + 48), acc3);
        }
        float *acc = partial + g * 66 + 2;
        _mm512_storeu_ps(acc, acc0);
        _mm512_storeu_ps(acc + 16, acc1);
        _mm512_storeu_ps(acc + 32, acc2);
        _mm512_storeu_ps(acc + 48, acc3);
    }
}
#endif

#if defined(__AVX512BF16__)
/* 16 bf16 in a register -> 16 floats. */
static inline __m512 widen_bf16_vector(__m256bh packed) { return widen_bf16_bits((__m256i)packed); }
#endif

/* Store each sequence's new K/V at its last position in `layer`, then attend its queries over
 * its positions: out[row, head, :] = softmax(scale * q . K) V, fp32 inside, bf16 out. With a
 * sliding `window` (> 0) only the last `window` positions, none before them read; 0: all.
 * q: (rows, heads, dim) with the given row and head strides (elements); k_new, v_new:
 * (rows, kv_heads, dim), head stride dim, each with its row stride; out: (rows, heads, dim) contiguous.
 * Returns 0, or -1 if a size is beyond the fixed limits or memory ran out. */
int tkv_decode_attention(int64_t num_seqs, const int64_t *table, int64_t layer,
                         const uint16_t *q, int64_t q_row_stride, int64_t q_head_stride,
                         const uint16_t *k_new, int64_t k_row_stride, const uint16_t *v_new,
                         int64_t v_row_stride,
                         int64_t heads, int64_t kv_heads, int64_t dim, float scale,
                         int64_t window, uint16_t *out) {
    const int64_t group = heads / kv_heads;
    if (group > MAX_GROUP || dim > MAX_DIM || group * kv_heads != heads) return -1;
    int64_t num_units = 0;
    for (int64_t b = 0; b < num_seqs; b++) {
        const int64_t *seq = table + b * SEQ_FIELDS;
        const int64_t first = window > 0 && seq[SEQ_LENGTH] > window ? seq[SEQ_LENGTH] - window : 0;
        num_units += kv_heads * ((seq[SEQ_LENGTH] - first + CHUNK - 1) / CHUNK);
    }
    Unit *units = malloc(sizeof(Unit) * (size_t)num_units);
    const int64_t partial_floats = group * (dim + 2); /* per unit: (max, sum, acc[dim]) x group */
    float *partials = malloc(sizeof(float) * (size_t)(num_units * partial_floats));
    if (units == NULL || partials == NULL) {
        free(units);
        free(partials);
        return -1;
    }
    int64_t u = 0;
    for (int64_t b = 0; b < num_seqs; b++) {
        const int64_t *seq = table + b * SEQ_FIELDS;
        const int64_t length = seq[SEQ_LENGTH], last = length - 1;
        const int64_t first = window > 0 && length > window ? length - window : 0;
        uint16_t *keys = (uint16_t *)(intptr_t)seq[SEQ_KEYS] + layer * seq[SEQ_LAYER_STRIDE];
        uint16_t *values = keys + seq[SEQ_VALUES_AT];
        for (int64_t h = 0; h < kv_heads; h++) {
            memcpy(keys + h * seq[SEQ_HEAD_STRIDE] + last * dim,
                   k_new + seq[SEQ_ROW] * k_row_stride + h * dim, sizeof(uint16_t) * dim);
            memcpy(values + h * seq[SEQ_HEAD_STRIDE] + last * dim,
                   v_new + seq[SEQ_ROW] * v_row_stride + h * dim, sizeof(uint16_t) * dim);
            for (int64_t lo = first; lo < length; lo += CHUNK) {
                units[u++] = (Unit){b, h, lo, lo + CHUNK < length ? lo + CHUNK : length};
            }
        }
    }

#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t i = 0; i < num_units; i++) {
        const Unit unit = units[i];
        const int64_t *seq = table + unit.seq * SEQ_FIELDS;
        const uint16_t *keys = (const uint16_t *)(intptr_t)seq[SEQ_KEYS] +
                               layer * seq[SEQ_LAYER_STRIDE] + unit.head * seq[SEQ_HEAD_STRIDE];
        const uint16_t *values = keys + seq[SEQ_VALUES_AT];
        const uint16_t *query_rows =
            q + seq[SEQ_ROW] * q_row_stride + unit.head * group * q_head_stride;
        keys += unit.lo * dim;
        values += unit.lo * dim;
        const int64_t n = unit.hi - unit.lo;
        float *partial = partials + i * partial_floats;
#if defined(__AVX512F__)
        if (dim == 64) {
            attend_unit_avx512(keys, values, n, query_rows, q_head_stride, scale, group, partial);
            continue;
        }
#endif
        if (dim == 64)
            attend_unit(keys, values, n, query_rows, q_head_stride, scale, 64, group, partial);
        else if (dim == 128)
            attend_unit(keys, values, n, query_rows, q_head_stride, scale, 128, group, partial);
        else
            attend_unit(keys, values, n, query_rows, q_head_stride, scale, dim, group, partial);
    }

    /* each (sequence, kv head)'s units are consecutive: merge their partial softmaxes */
    for (int64_t first = 0; first < num_units;) {
        int64_t end = first + 1;
        while (end < num_units && units[end].seq == units[first].seq &&
               units[end].head == units[first].head)
            end++;
        const int64_t *seq = table + units[first].seq * SEQ_FIELDS;
        for (int64_t g = 0; g < group; g++) {
            float top = -INFINITY, sum = 0.0f, merged[MAX_DIM];
            for (int64_t i = first; i < end; i++) {
                const float m = partials[i * partial_floats + g * (dim + 2)];
                top = m > top ? m : top;
            }
            memset(merged, 0, sizeof(float) * (size_t)dim);
            for (int64_t i = first; i < end; i++) {
                const float *acc = partials + i * partial_floats + g * (dim + 2);
                const float weight = expf(acc[0] - top);
                sum += weight * acc[1];
                for (int64_t d = 0; d < dim; d++) merged[d] += weight * acc[2 + d];
            }
            uint16_t *dst = out + (seq[SEQ_ROW] * heads + units[first].head * group + g) * dim;
            for (int64_t d = 0; d < dim; d++) dst[d] = f32_to_bf16(merged[d] / sum);
        }
        first = end;
    }
    free(units);
    free(partials);
    return 0;
}

/* RMSNorm as transformers computes it in bf16: y = bf16(x * rsqrt(mean(x^2) + eps)), then
 * bf16(y * weight); fp32 inside. x: (rows, dim), row stride x_stride; out: (rows, dim). */
void tkv_rms_norm(int64_t rows, int64_t dim, const uint16_t *x, int64_t x_stride,
                  const uint16_t *weight, float eps, uint16_t *out) {
#pragma omp parallel for if (rows >= 64)
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *src = x + r * x_stride;
        float squares = 0.0f;
#pragma omp simd reduction(+ : squares)
        for (int64_t d = 0; d < dim; d++) {
            const float f = bf16_to_f32(src[d]);
            squares += f * f;
        }
        const float inverse = 1.0f / sqrtf(squares / (float)dim + eps);
        uint16_t *dst = out + r * dim;
        for (int64_t d = 0; d < dim; d++) {
            const float normed = bf16_to_f32(f32_to_bf16(bf16_to_f32(src[d]) * inverse));
            dst[d] = f32_to_bf16(normed * bf16_to_f32(weight[d]));
        }
    }
}

/* RoPE as transformers computes it in bf16: out = bf16(bf16(x * cos) + bf16(rotate_half(x) *
 * sin)), each product rounded as torch's bf16 ops round it (so equal to the eager chain bit for
 * bit). x: (tokens, heads, dim) with strides (x_token_stride, x_head_stride, 1); cos/sin:
 * (tokens, dim) rows `table_stride` apart; out: (tokens, heads, dim) contiguous. */
void tkv_rope(int64_t tokens, int64_t heads, int64_t dim, const uint16_t *x,
              int64_t x_token_stride, int64_t x_head_stride, const uint16_t *cos,
              const uint16_t *sin, int64_t table_stride, uint16_t *out) {
    const int64_t half = dim / 2;
#pragma omp parallel for if (tokens * heads * dim >= 32768)
    for (int64_t t = 0; t < tokens; t++) {
        const uint16_t *c = cos + t * table_stride, *s = sin + t * table_stride;
        for (int64_t h = 0; h < heads; h++) {
            const uint16_t *src = x + t * x_token_stride + h * x_head_stride;
            uint16_t *dst = out + (t * heads + h) * dim;
#pragma omp simd
            for (int64_t d = 0; d < half; d++) { /* rotate_half: (-x2, x1) */
                const float kept = bf16_to_f32(f32_to_bf16(bf16_to_f32(src[d]) * bf16_to_f32(c[d])));
                const float turned =
                    bf16_to_f32(f32_to_bf16(-bf16_to_f32(src[d + half]) * bf16_to_f32(s[d])));
                dst[d] = f32_to_bf16(kept + turned);
            }
#pragma omp simd
            for (int64_t d = half; d < dim; d++) {
                const float kept = bf16_to_f32(f32_to_bf16(bf16_to_f32(src[d]) * bf16_to_f32(c[d])));
                const float turned =
                    bf16_to_f32(f32_to_bf16(bf16_to_f32(src[d - half]) * bf16_to_f32(s[d])));
                dst[d] = f32_to_bf16(kept + turned);
            }
        }
    }
}

/* Softmax of each row of bf16 scores in place, as torch's bf16 softmax computes it (fp32
 * inside, bf16 out): rows (rows, cols) with row stride `stride`; -inf entries get 0.
 * Returns 0, or -1 if a row is longer than SOFTMAX_MAX_COLS. */
#define SOFTMAX_MAX_COLS 16384

#if defined(__AVX512BF16__)
/* exp_nonpositive on 16 lanes: the same reduction and polynomial, 0 below -87. */
static inline __m512 exp_nonpositive_x16(__m512 x) {
    const __mmask16 kept = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 shifter = _mm512_set1_ps(12582912.0f);
    const __m512 n = _mm512_sub_ps(
        _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), shifter), shifter);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    const __m512i exponent = _mm512_slli_epi32(
        _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mul_ps(kept, p, _mm512_castsi512_ps(exponent));
}

/* One row, 16 lanes at a time (the last vector masked): ~2x the compiler's vectors of the
 * plain loop below, whose float -> bf16 rounding and exponent steps do not vectorize as
 * well. `values` holds the row in fp32 between the passes, padded to whole vectors. */
static void softmax_row(uint16_t *row, int64_t cols, float *values) {
    const int64_t full = cols & ~(int64_t)15;
    const __mmask16 tail = (__mmask16)((1u << (cols - full)) - 1u);
    const __m512 minus_inf = _mm512_set1_ps(-INFINITY);
    __m512 top = minus_inf;
    for (int64_t c = 0; c < full; c += 16) {
        const __m512 v = widen_bf16(row + c);
        _mm512_storeu_ps(values + c, v);
        top = _mm512_max_ps(top, v);
    }
    if (tail) {
        const __m256bh raw = (__m256bh)_mm256_maskz_loadu_epi16(tail, row + full);
        const __m512 v = _mm512_mask_mov_ps(minus_inf, tail, widen_bf16_vector(raw));
        _mm512_storeu_ps(values + full, v);
        top = _mm512_max_ps(top, v);
    }
    const __m512 shift = _mm512_set1_ps(_mm512_reduce_max_ps(top));
    const int64_t padded = full + (tail ? 16 : 0);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t c = 0; c < padded; c += 16) {
        const __m512 e = exp_nonpositive_x16(_mm512_sub_ps(_mm512_loadu_ps(values + c), shift));
        _mm512_storeu_ps(values + c, e);
        sum = _mm512_add_ps(sum, e);
    }
    const __m512 inverse = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
    for (int64_t c = 0; c < full; c += 16) {
        const __m256bh out = _mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_loadu_ps(values + c), inverse));
        _mm256_storeu_si256((__m256i *)(row + c), (__m256i)out);
    }
    if (tail) {
        const __m256bh out = _mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_loadu_ps(values + full), inverse));
        _mm256_mask_storeu_epi16(row + full, tail, (__m256i)out);
    }
}
#else
static void softmax_row(uint16_t *row, int64_t cols, float *values) {
    float top = -INFINITY, sum = 0.0f;
#pragma omp simd reduction(max : top)
    for (int64_t c = 0; c < cols; c++) {
        values[c] = bf16_to_f32(row[c]);
        top = values[c] > top ? values[c] : top;
    }
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < cols; c++) {
        values[c] = exp_nonpositive(values[c] - top);
        sum += values[c];
    }
    const float inverse = 1.0f / sum;
#pragma omp simd
    for (int64_t c = 0; c < cols; c++) row[c] = f32_to_bf16(values[c] * inverse);
}
#endif

/* silu(gate) * up of a SwiGLU MLP, each rounded to bf16 as torch's two ops round them:
 * gate_up: (rows, 2 * width), row stride `stride`, gate first; out: (rows, width). The
 * sigmoid goes through e^-|g| (exp_nonpositive), 1 / (1 + e) or e / (1 + e) by g's sign. */
static void silu_and_mul_row(const uint16_t *gate, const uint16_t *up, int64_t width,
                             uint16_t *dst) {
    int64_t i = 0;
#if defined(__AVX512BF16__)
    for (; i + 16 <= width; i += 16) {
        const __m512 g = widen_bf16(gate + i);
        const __m512 negative_abs = _mm512_min_ps(g, _mm512_sub_ps(_mm512_setzero_ps(), g));
        const __m512 e = exp_nonpositive_x16(negative_abs);
        const __mmask16 positive = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_GT_OQ);
        const __m512 numerator = _mm512_mask_mov_ps(e, positive, _mm512_set1_ps(1.0f));
        const __m512 sigmoid = _mm512_div_ps(numerator, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
        const __m512 silu = widen_bf16_vector(_mm512_cvtneps_pbh(_mm512_mul_ps(g, sigmoid)));
        const __m256bh product = _mm512_cvtneps_pbh(_mm512_mul_ps(silu, widen_bf16(up + i)));
        _mm256_storeu_si256((__m256i *)(dst + i), (__m256i)product);
    }
#endif
    for (; i < width; i++) {
        const float g = bf16_to_f32(gate[i]);
        const float e = exp_nonpositive(g > 0.0f ? -g : g); /* e^-|g| */
        const float sigmoid = g > 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
        const float silu = bf16_to_f32(f32_to_bf16(g * sigmoid));
        dst[i] = f32_to_bf16(silu * bf16_to_f32(up[i]));
    }
}

void tkv_silu_and_mul(int64_t rows, int64_t width, const uint16_t *gate_up, int64_t stride,
                      uint16_t *out) {
#pragma omp parallel for if (rows * width >= 32768)
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *gate = gate_up + r * stride;
        silu_and_mul_row(gate, gate + width, width, out + r * width);
    }
}

int tkv_softmax(int64_t rows, int64_t cols, uint16_t *scores, int64_t stride) {
    if (cols > SOFTMAX_MAX_COLS) return -1;
#pragma omp parallel for if (rows * cols >= 32768)
    for (int64_t r = 0; r < rows; r++) {
        float values[SOFTMAX_MAX_COLS + 16];
        softmax_row(scores + r * stride, cols, values);
    }
    return 0;
}

/* A bf16 weight times a few bf16 rows, for a CPU that emulates bf16: out = bf16(x W^T + bias
 * + residual), products and sums in fp32, one rounding. Each weight row is read once and
 * widened in registers for all the rows (oneDNN's emulated bf16 at 8 rows ran ~4x its one-row
 * time, its fp32 product on an fp32 copy reads twice the bytes). x: (rows, in), row stride
 * x_stride; w: (out, in) contiguous; bias (out) and residual (rows, out) contiguous or NULL;
 * out: (rows, out). Returns 0, or -1 for more than FEW_ROWS rows or memory run out. */
#define FEW_ROWS 8

int tkv_linear_few_rows(int64_t rows, int64_t in_features, int64_t out_features,
                        const uint16_t *x, int64_t x_stride, const uint16_t *w,
                        const uint16_t *bias, const uint16_t *residual, uint16_t *out) {
    if (rows < 1 || rows > FEW_ROWS) return -1;
    float *wide = malloc(sizeof(float) * (size_t)(rows * in_features));
    if (wide == NULL) return -1;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < in_features; i++)
            wide[r * in_features + i] = bf16_to_f32(x[r * x_stride + i]);
    }
#pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < out_features; o++) {
        const uint16_t *row = w + o * in_features;
        float sums[FEW_ROWS];
        int64_t i = 0;
#if defined(__AVX512F__)
        __m512 acc[FEW_ROWS];
        for (int64_t r = 0; r < rows; r++) acc[r] = _mm512_setzero_ps();
        for (; i + 16 <= in_features; i += 16) {
            const __m512 weights = widen_bf16(row + i);
            for (int64_t r = 0; r < rows; r++)
                acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(wide + r * in_features + i), weights,
                                         acc[r]);
        }
        for (int64_t r = 0; r < rows; r++) sums[r] = _mm512_reduce_add_ps(acc[r]);
#else
        for (int64_t r = 0; r < rows; r++) sums[r] = 0.0f;
#endif
        for (; i < in_features; i++) {
            const float weight = bf16_to_f32(row[i]);
            for (int64_t r = 0; r < rows; r++) sums[r] += wide[r * in_features + i] * weight;
        }
        const float b = bias != NULL ? bf16_to_f32(bias[o]) : 0.0f;
        for (int64_t r = 0; r < rows; r++) {
            float y = sums[r] + b;
            if (residual != NULL) y += bf16_to_f32(residual[r * out_features + o]);
            out[r * out_features + o] = f32_to_bf16(y);
        }
    }
    free(wide);
    return 0;
}

/* y = bf16(x @ W.T + bias + residual) for any number of bf16 rows, on a weight laid out by
 * output blocks of 16 and input pairs: packed[block][pair][16 outputs][2 inputs] (in_features
 * even, out_features a multiple of 16). One vdpbf16ps multiplies a broadcast input pair of a
 * row by a block's 16 outputs x 2 inputs and sums into 16 fp32 lanes, one per output, so the
 * weight streams once for all rows with no widening and no horizontal sums; each row's sums
 * run in the same order whatever the other rows (rows go eight at a time over a block, which
 * stays in cache between them). bias (out) and residual (rows, out; row
 * stride residual_stride) are bf16 or NULL; out (rows, out) contiguous. Returns 0, or -1
 * without AVX512-BF16 or for shapes the layout does not cover. */
#define PAIRED_TILE 8

#if defined(__AVX512BF16__)
static inline __attribute__((always_inline)) void paired_block(
    int64_t rows, int64_t pairs, const uint32_t *const *x, const uint16_t *weights, __m512 *acc) {
    for (int64_t r = 0; r < rows; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t p = 0; p < pairs; p++) {
        const __m512bh w = (__m512bh)_mm512_loadu_si512(weights + p * 32);
        for (int64_t r = 0; r < rows; r++)
            acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)_mm512_set1_epi32((int)x[r][p]), w);
    }
}
#endif

int tkv_linear_paired(int64_t rows, int64_t in_features, int64_t out_features,
                      const uint16_t *x, int64_t x_stride, const uint16_t *packed,
                      const uint16_t *bias, const uint16_t *residual, int64_t residual_stride,
                      uint16_t *out) {
#if defined(__AVX512BF16__)
    if (rows < 1 || in_features % 2 || out_features % 16) return -1;
    if (x_stride % 2) return -1;
    const int64_t pairs = in_features / 2, blocks = out_features / 16;
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        const uint16_t *weights = packed + b * pairs * 32;
        __m512 extra = _mm512_setzero_ps();
        if (bias != NULL)
            extra = widen_bf16_bits(_mm256_loadu_si256((const __m256i *)(bias + b * 16)));
        for (int64_t r0 = 0; r0 < rows; r0 += PAIRED_TILE) {
            const int64_t tile = rows - r0 < PAIRED_TILE ? rows - r0 : PAIRED_TILE;
            const uint32_t *x8[PAIRED_TILE];
            __m512 acc[PAIRED_TILE];
            for (int64_t r = 0; r < tile; r++)
                x8[r] = (const uint32_t *)(x + (r0 + r) * x_stride);
            switch (tile) { /* a constant row count unrolls the loop */
            case 1: paired_block(1, pairs, x8, weights, acc); break;
            case 2: paired_block(2, pairs, x8, weights, acc); break;
            case 3: paired_block(3, pairs, x8, weights, acc); break;
            case 4: paired_block(4, pairs, x8, weights, acc); break;
            case 5: paired_block(5, pairs, x8, weights, acc); break;
            case 6: paired_block(6, pairs, x8, weights, acc); break;
            case 7: paired_block(7, pairs, x8, weights, acc); break;
            default: paired_block(8, pairs, x8, weights, acc); break;
            }
            for (int64_t r = 0; r < tile; r++) {
                __m512 y = _mm512_add_ps(acc[r], extra);
                if (residual != NULL) {
                    const uint16_t *res = residual + (r0 + r) * residual_stride + b * 16;
                    const __m256i bits = _mm256_loadu_si256((const __m256i *)res);
                    y = _mm512_add_ps(y, widen_bf16_bits(bits));
                }
                _mm256_storeu_si256((__m256i *)(out + (r0 + r) * out_features + b * 16),
                                    (__m256i)_mm512_cvtneps_pbh(y));
            }
        }
    }
    return 0;
#else
    (void)rows, (void)in_features, (void)out_features, (void)x, (void)x_stride, (void)packed;
    (void)bias, (void)residual, (void)residual_stride, (void)out;
    return -1;
#endif
}
